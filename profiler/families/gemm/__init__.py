"""GEMM ``x [M, K] @ W[N, K].T``, with the layer's bias where it has one: every linear layer, the
logits projection (lm_head) and a MoE router the engine applies itself. Op type ``gemm``; hooked
on the engines' unquantized linear methods and their logits processors."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import SHORT_DTYPES, KernelCall, cached_definition, rows
from fi_profile.capture.layers import recorded_elsewhere, seen
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, Family, matmul_flops
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

KEY = "gemm"


def name(n: int, k: int, dtype: DType, bias: bool = False, out_dtype: Optional[DType] = None) -> str:
    """flashinfer-trace's ``gemm_n{N}_k{K}`` are float16; a GEMM of another dtype has another
    interface, so its own name: ``gemm_bf16_n4096_k4096``; with a bias, ``gemm_bias_bf16_...``; with
    a result of another dtype than its operands (a router's float32 logits), ``..._out_fp32``."""
    kind = "gemm_bias" if bias else "gemm"
    out = f"_out_{SHORT_DTYPES.get(out_dtype, getattr(out_dtype, 'value', ''))}" if out_dtype not in (None, dtype) else ""
    if dtype is DType.float16:
        return f"{kind}_n{n}_k{k}{out}"
    return f"{kind}_{SHORT_DTYPES.get(dtype, dtype.value)}_n{n}_k{k}{out}"


def call(x: torch.Tensor, n: int, k: int, bias: bool = False) -> KernelCall:
    """``n`` and ``k`` are the layer's logical sizes (never read from a weight tensor, which a
    backend may have packed, quantized or replaced by an empty one); ``bias``: the GEMM adds one."""

    return sized_call(rows(x, k), n, k, x.dtype, bias)


#: the template of a GEMM whose result is float32 from lower-precision operands (no bias)
FLOAT32_OUT_TEMPLATE = "gemm_bf16_n256_k7168_out_fp32"


def sized_call(m: int, n: int, k: int, dtype: torch.dtype, bias: bool = False,
               out_dtype: Optional[torch.dtype] = None) -> KernelCall:
    """A GEMM of ``m`` rows (where no input tensor is at hand: a layer another call records);
    ``out_dtype``: its result's dtype where not its operands' (float32 only)."""
    out = None if out_dtype in (None, dtype) else out_dtype

    def build() -> Definition:
        schema = schema_dtype(dtype)
        if out is not None:
            if out is not torch.float32 or bias:
                raise NotImplementedError(f"a GEMM of {schema.value} operands giving {out} (bias: {bias}): no Definition")
            return definition_for(FLOAT32_OUT_TEMPLATE, name(n, k, schema, out_dtype=DType.float32), {"N": n, "K": k},
                                  schema)
        template = "gemm_bias_bf16_n4096_k4096" if bias else "gemm_bf16_n4096_k4096"
        return definition_for(template, name(n, k, schema, bias), {"N": n, "K": k}, schema)

    definition = cached_definition(("gemm", n, k, dtype, bias, out), build)
    return KernelCall(definition, {"M": m})


def layer_size(layer: Any) -> tuple[int, int]:
    """A linear layer's logical ``(N, K)`` on this rank, from the sizes the layer declares.

    Never from ``layer.weight``: backends repack it (vLLM on CPUs with AVX-512 BF16 hands it to
    oneDNN or its own kernel and leaves an empty tensor; SGLang packs it for AMX), quantized
    methods store it packed or transposed, and its shape then says nothing about the GEMM."""
    if hasattr(layer, "num_embeddings_per_partition") and hasattr(layer, "embedding_dim"):  # lm_head
        return int(layer.num_embeddings_per_partition), int(layer.embedding_dim)
    if isinstance(layer, torch.nn.Embedding):  # a tied lm_head that is torch's own table (SGLang's Gemma-3)
        return int(layer.num_embeddings), int(layer.embedding_dim)
    n = getattr(layer, "output_size_per_partition", None)
    if n is None:
        sizes = getattr(layer, "output_partition_sizes", None)
        n = sum(sizes) if sizes else getattr(layer, "output_size", None)
    k = getattr(layer, "input_size_per_partition", None) or getattr(layer, "input_size", None)
    if n is None or k is None:
        raise NotImplementedError(
            f"{type(layer).__name__}: declares no logical sizes (output_size[_per_partition], input_size[_per_partition])"
        )
    return int(n), int(k)


def linear_calls(self: Any, layer: Any, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> list:
    """An unquantized linear method's ``apply(layer, x, bias)`` (vLLM and SGLang alike): the bias it
    is handed is the one the GEMM adds (a layer that adds its bias later passes none)."""
    seen(layer)
    if recorded_elsewhere(layer):  # a MoE router or shared expert its MoE call records
        return []
    return [call(x, *layer_size(layer), bias=bias is not None)]


def logits_problem(layer: Any, soft_cap: Optional[float], scale: Optional[float]) -> Optional[str]:
    """Why a logits processor computes more than its lm_head GEMM, or None: a soft cap (Gemma-2's
    final ``tanh`` cap) or a scale on the logits, which no Definition computes (vLLM's ``soft_cap`` /
    ``scale``, SGLang's ``final_logit_softcapping`` / ``logit_scale``)."""
    found = [what for what, applies in {f"soft_cap={soft_cap}": soft_cap is not None,
                                        f"scale={scale}": scale not in (None, 1.0)}.items() if applies]
    return (f"{type(layer).__name__} with {', '.join(found)} (the logits changed after the lm_head: no Definition "
            "computes it)") if found else None


def lm_head_calls(self: Any, lm_head: Any, hidden_states: torch.Tensor,
                  embedding_bias: Optional[torch.Tensor] = None) -> list:
    """The logits projection (vLLM and SGLang name these arguments alike, in different orders)."""
    seen(self, lm_head)
    return [call(hidden_states, *layer_size(lm_head), bias=embedding_bias is not None)]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("gemm",),
    templates=("gemm_bf16_n4096_k4096", "gemm_bias_bf16_n4096_k4096", FLOAT32_OUT_TEMPLATE),
    # the float32-result one first: it fits only Definitions that say so (their OUTPUT_FLOAT32)
    baselines=(Baseline("torch_gemm_out_fp32.py", constants=("OUTPUT_FLOAT32",)), Baseline("torch_gemm.py")),
    engine_kernel=engine_kernels.torch_call,
    flops=matmul_flops,
    kernel_words=("gemm", "gemv", "nvjet", "cutlass", "cublas", "cublaslt", "splitkreduce", "xmma", "wgmma", "mm", "addmm", "bmm",
                  "linear", "matmul", "onednn"),
    head_words=("memset",),  # cuBLAS's split-K GEMMs clear their workspace first
    continue_words=("splitkreduce",),  # and sum their partial products after
)
