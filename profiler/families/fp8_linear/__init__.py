"""FP8 linear layers as the engines run them: two kernels per layer and step. First the activations
are quantized by their own kernel, then the FP8 GEMM multiplies them with the checkpoint's FP8
weight, each operand dequantized by its scales (bfloat16 result). Two kinds of checkpoint:

- 128x128 block-scale weights (DeepSeek-V3/R1, Qwen3-FP8): activations dynamic per token and group
  of ``block_k`` columns (op type ``quant_fp8_per_token_group``; ``_ue8m0`` where the engine rounds
  each scale up to a power of two for DeepGEMM), GEMM ``gemm_fp8_block_scale``;
- per-tensor or per-channel weight scales (``quant_method: fp8``, compressed-tensors W8A8 FP8:
  Llama-3.1-8B-FP8): activations dynamic per tensor or per token (``quant_fp8_per_tensor``,
  ``quant_fp8_per_token``), GEMM ``gemm_fp8_scaled`` (A per tensor or per token, B per tensor or
  per channel: the scales' shapes say which, the name too).

Static per-tensor quantization by a scale given beforehand (``quant_fp8_static_per_tensor``) is the
kernel vLLM runs on the queries before its Triton attention reads an FP8 KV cache.

The scales are inputs of the Definitions, so a Solution sees exactly what the engine's kernel sees.

References dequantize in float32; an FP8 GEMM's output is a sum of K rounded products, so its check
takes bfloat16's atol relative to the reference's largest magnitude (``Family.atol_of_largest``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import SHORT_DTYPES, KernelCall, cached_definition, rows
from fi_profile.families import gemm
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native, matmul_flops
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype
from fi_profile.schema.reference import reference_constant

KEY = "fp8_linear"
GEMM_TEMPLATE = "gemm_fp8_block_scale_n7168_k2048"
QUANT_TEMPLATE = "quant_fp8_per_token_group_k7168_g128"
#: the block shape of the templates (DeepSeek-V3's ``weight_block_size``)
BLOCK = (128, 128)
#: (activation scales per, weight scales per) -> the scaled GEMM's template
SCALED_TEMPLATES = {("tensor", "tensor"): "gemm_fp8_per_tensor_scale_n4096_k4096",
                    ("token", "channel"): "gemm_fp8_per_token_channel_scale_n4096_k4096",
                    ("token", "tensor"): "gemm_fp8_per_token_tensor_scale_n4096_k4096",
                    ("tensor", "channel"): "gemm_fp8_per_tensor_channel_scale_n4096_k4096"}
#: dynamic activation scales per -> the quantization's template
DYNAMIC_QUANT_TEMPLATES = {"tensor": "quant_fp8_per_tensor_k4096", "token": "quant_fp8_per_token_k4096"}


def _blocks(size: int, block: int) -> int:
    return -(-size // block)


def _block_suffix(block: Sequence[int]) -> str:
    return "" if tuple(block) == BLOCK else f"_b{block[0]}x{block[1]}"


def quant_call(m: int, k: int, group_size: int, dtype: torch.dtype, power_of_two: bool = False) -> KernelCall:
    """The activation quantization before an FP8 block-scale GEMM: ``m`` tokens of ``k`` values in
    groups of ``group_size``; ``power_of_two``: each scale rounded up to a power of two, as DeepGEMM
    takes them (UE8M0: ``quant_fp8_per_token_group_ue8m0_*``; the GEMM after it is the same)."""

    def build() -> Definition:
        if k % group_size:
            raise NotImplementedError(f"per-token-group FP8 quantization of {k} columns in groups of {group_size}")
        schema = schema_dtype(dtype)
        suffix = "" if schema.value == "bfloat16" else f"_{SHORT_DTYPES.get(schema, schema.value)}"
        scales = "_ue8m0" if power_of_two else ""
        return definition_for(QUANT_TEMPLATE, f"quant_fp8_per_token_group{scales}_k{k}_g{group_size}{suffix}",
                              {"K": k, "num_groups": k // group_size}, schema,
                              {"GROUP_SIZE": group_size, "POWER_OF_TWO_SCALES": int(power_of_two)})

    definition = cached_definition(("quant_fp8_per_token_group", k, group_size, dtype, power_of_two), build)
    return KernelCall(definition, {"M": m})


def block_gemm_call(m: int, n: int, k: int, block: Sequence[int], out_dtype: torch.dtype) -> KernelCall:
    """An FP8 block-scale GEMM of ``m`` rows: an ``[n, k]`` weight in ``block`` (n, k) blocks."""
    block_n, block_k = (int(b) for b in block)

    def build() -> Definition:
        schema = schema_dtype(out_dtype)
        out = "" if schema.value == "bfloat16" else f"_out_{SHORT_DTYPES.get(schema, schema.value)}"
        consts = {"N": n, "K": k, "num_n_blocks": _blocks(n, block_n), "num_k_blocks": _blocks(k, block_k)}
        name = f"gemm_fp8_block_scale_n{n}_k{k}{_block_suffix((block_n, block_k))}{out}"
        return definition_for(GEMM_TEMPLATE, name, consts, schema, {"BLOCK_N": block_n, "BLOCK_K": block_k})

    definition = cached_definition(("gemm_fp8_block_scale", n, k, block_n, block_k, out_dtype), build)
    return KernelCall(definition, {"M": m})


def block_linear_calls(x: torch.Tensor, n: int, k: int, block: Sequence[int], quantized_here: bool = True) -> list:
    """One FP8 block-scale linear layer's kernels on ``x`` (its high-precision input): the
    activation quantization (unless the input comes quantized: ``quantized_here`` False), then the
    GEMM, whose result has ``x``'s dtype. ``n``, ``k``: the layer's logical sizes."""
    m = rows(x, k)
    calls = [quant_call(m, k, int(block[1]), x.dtype)] if quantized_here else []
    return calls + [block_gemm_call(m, n, k, block, x.dtype)]


#: the compressed-tensors scheme that runs the engines' FP8 kernels (W8A8 FP8: per tensor, channel or block)
FP8_SCHEME = "CompressedTensorsW8A8Fp8"


def layer_runner(layer: Any) -> Any:
    """What runs an FP8 linear layer's kernels, in both engines: its ``Fp8LinearMethod``, or, under
    compressed-tensors' ``CompressedTensorsLinearMethod``, the layer's own scheme."""
    method = layer.quant_method
    return getattr(layer, "scheme", None) if type(method).__name__ == "CompressedTensorsLinearMethod" else method


def runner_name(layer: Any, runner: Any) -> str:
    """The layer's quantization method as a listing names it (with its compressed-tensors scheme)."""
    method = type(layer.quant_method).__name__
    return method if runner is layer.quant_method else f"{method}, scheme {type(runner).__name__}"


def unknown_scheme(layer: Any, runner: Any) -> Optional[str]:
    """Why a compressed-tensors layer of a scheme other than W8A8 FP8 is listed, or None."""
    if runner is layer.quant_method or type(runner).__name__ == FP8_SCHEME:
        return None
    return f"{type(layer).__name__} with {runner_name(layer, runner)} (no Definition computes it)"


def weight_blocks(runner: Any) -> Optional[Sequence[int]]:
    """The weight's block shape ``[block_n, block_k]`` (:func:`layer_runner`'s), or None without blocks."""
    if type(runner).__name__ == FP8_SCHEME:
        return getattr(runner, "weight_block_size", None)
    return getattr(runner, "weight_block_size", None) if getattr(runner, "block_quant", False) else None


def _dtype_suffix(dtype: torch.dtype, prefix: str = "_") -> str:
    schema = schema_dtype(dtype)
    return "" if schema.value == "bfloat16" else f"{prefix}{SHORT_DTYPES.get(schema, schema.value)}"


def dynamic_quant_call(m: int, k: int, per: str, dtype: torch.dtype) -> KernelCall:
    """Dynamic FP8 quantization of ``m`` tokens of ``k`` values, one scale ``per`` "tensor" or "token"."""
    if per not in DYNAMIC_QUANT_TEMPLATES:
        raise NotImplementedError(f"dynamic FP8 quantization per {per}: no Definition")

    def build() -> Definition:
        return definition_for(DYNAMIC_QUANT_TEMPLATES[per], f"quant_fp8_per_{per}_k{k}{_dtype_suffix(dtype)}", {"K": k},
                              schema_dtype(dtype))

    return KernelCall(cached_definition((f"quant_fp8_per_{per}", k, dtype), build), {"M": m})


STATIC_QUANT_TEMPLATE = "quant_fp8_static_per_tensor_k4096"


def static_quant_call(m: int, k: int, dtype: torch.dtype) -> KernelCall:
    """Static FP8 quantization of ``m`` rows of ``k`` values by a scale given beforehand (vLLM's
    ``scaled_fp8_quant`` with a scale: the queries before its Triton attention over an FP8 cache)."""

    def build() -> Definition:
        return definition_for(STATIC_QUANT_TEMPLATE, f"quant_fp8_static_per_tensor_k{k}{_dtype_suffix(dtype)}", {"K": k},
                              schema_dtype(dtype))

    return KernelCall(cached_definition(("quant_fp8_static_per_tensor", k, dtype), build), {"M": m})


def scaled_gemm_call(m: int, n: int, k: int, activation: str, weight: str, out_dtype: torch.dtype) -> KernelCall:
    """An FP8 GEMM of ``m`` rows with an ``[n, k]`` weight, its activations' scales per ``activation``
    ("tensor", "token"), its weight's per ``weight`` ("tensor", "channel")."""
    template = SCALED_TEMPLATES.get((activation, weight))
    if template is None:
        raise NotImplementedError(f"FP8 GEMM with activation scales per {activation} and weight scales per {weight}: "
                                  "no Definition")
    kind = "tensor" if activation == weight == "tensor" else f"{activation}_{weight}"

    def build() -> Definition:
        return definition_for(template, f"gemm_fp8_per_{kind}_scale_n{n}_k{k}{_dtype_suffix(out_dtype, '_out_')}",
                              {"N": n, "K": k}, schema_dtype(out_dtype))

    return KernelCall(cached_definition(("gemm_fp8_scaled", kind, n, k, out_dtype), build), {"M": m})


def scaled_linear_calls(x: torch.Tensor, n: int, k: int, activation: str, weight: str,
                        quantized_here: bool = True) -> list:
    """One FP8 linear layer with per-tensor or per-channel weight scales on ``x`` (its high-precision
    input): the dynamic activation quantization (unless the input comes quantized, or its scale is
    the checkpoint's static one: ``quantized_here`` False), then the GEMM in ``x``'s dtype."""
    m = rows(x, k)
    calls = [dynamic_quant_call(m, k, activation, x.dtype)] if quantized_here else []
    return calls + [scaled_gemm_call(m, n, k, activation, weight, x.dtype)]


#: vLLM's compiled ops (``_C``; ``_C_stable_libtorch`` in builds against PyTorch's stable ABI)
_VLLM_C = ("vllm._C", "vllm._C_stable_libtorch")
#: where vLLM keeps its Triton block-FP8 GEMM
_VLLM_BLOCK_TRITON = "vllm.model_executor.layers.quantization.utils.fp8_utils"


def _cutlass_blocks(definition: Definition) -> bool:
    """Whether the block-scale GEMM's blocks are the only ones vLLM's CUTLASS kernel takes: 128 x 128
    weight blocks, 1 x 128 activation groups."""
    return [reference_constant(definition.reference, name) for name in ("BLOCK_N", "BLOCK_K")] == ["128", "128"]


#: sgl-kernel, whose CUTLASS FP8 GEMM and per-token quantization SGLang runs for layers without blocks
_SGLANG_KERNEL = "sgl_kernel"
#: where SGLang's FP8 linear layers import their block kernels from (their own modules moved between versions)
_SGLANG_FP8 = "sglang.srt.layers.quantization.fp8_utils"
#: SGLang's Triton block-FP8 GEMM kernels (and their ``_unrolledx4`` variant), which its native runs
_SGLANG_TRITON_BLOCK_KERNEL = "_w8a8_block_fp8_matmul"


def _per_token_channel(definition: Definition) -> bool:
    """Whether the scaled GEMM takes one scale per token of A and one per channel of B."""
    return [len(definition.inputs[name].shape or ()) for name in ("A_scale", "B_scale")] == [1, 1]


def _sglang_natives_fit(definition: Definition) -> bool:
    """Whether a per-token-group quantization keeps float32 scales (SGLang's power-of-two ones are
    packed for DeepGEMM: another layout than the Definition's)."""
    return reference_constant(definition.reference, "POWER_OF_TWO_SCALES") in (None, "0")


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """For the block-scale GEMM: vLLM's Triton block-FP8 GEMM, and its CUTLASS one (128 x 128 blocks
    only). For the scaled GEMM: vLLM's CUTLASS scaled-mm (any mix of scales), SGLang's (sgl-kernel's
    ``fp8_scaled_mm``: per token and per channel, the layout SGLang gives it), and ``torch._scaled_mm``
    (cuBLASLt's FP8 GEMM, per-tensor or row-wise scales on both operands) where its two scales are
    of one kind (a mixed layout would need one expanded in the timed call, which is not what the
    engines run). For the per-token quantization: SGLang's (sgl-kernel's). For the block GEMM and the
    per-token-group quantization before it (float32 scales): SGLang's Triton GEMM and its quantization."""
    if definition.op_type == "quant_fp8_per_token":
        return [Native("sglang", "sglang_quant_fp8_per_token.py", requires=_SGLANG_KERNEL)]
    if definition.op_type == "quant_fp8_per_token_group":
        return [Native("sglang", "sglang_quant_fp8_per_token_group.py", constants=("GROUP_SIZE",), requires=_SGLANG_FP8)
                ] if _sglang_natives_fit(definition) else []
    if definition.op_type == "gemm_fp8_block_scale":
        natives = [Native("vllm", "vllm_triton_block_fp8_gemm.py", constants=("BLOCK_N", "BLOCK_K"), must_fit=True,
                          requires=_VLLM_BLOCK_TRITON, label="vllm_triton"),
                   Native("sglang", "sglang_triton_block_fp8_gemm.py", constants=("BLOCK_N", "BLOCK_K"), must_fit=True,
                          requires=_SGLANG_FP8, label="sglang_triton")]
        if _cutlass_blocks(definition):
            natives.append(Native("vllm", "vllm_cutlass_block_fp8_gemm.py", must_fit=True, requires=_VLLM_C,
                                  label="vllm_cutlass"))
        return natives
    if definition.op_type != "gemm_fp8_scaled":
        return []
    natives = [Native("vllm", "vllm_cutlass_scaled_mm.py", must_fit=True, requires=_VLLM_C, label="vllm_cutlass")]
    if _per_token_channel(definition):
        natives.append(Native("sglang", "sglang_cutlass_scaled_mm.py", must_fit=True, requires=_SGLANG_KERNEL,
                              label="sglang_cutlass"))
    if len(definition.inputs["A_scale"].shape or ()) == len(definition.inputs["B_scale"].shape or ()):
        natives.append(Native("torch", "torch_scaled_mm.py", must_fit=True, label="torch_scaled_mm"))
    return natives


#: activation quantizations that vLLM's compiled forward leaves to Inductor (``QuantFP8.forward_native``)
_INDUCTOR_QUANT = ("quant_fp8_per_token", "quant_fp8_per_tensor", "quant_fp8_static_per_tensor")

#: vLLM's Triton block-FP8 GEMM kernel, which its native runs
_VLLM_TRITON_BLOCK_KERNEL = "_w8a8_triton_block_scaled_mm"


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """vLLM's FP8 GEMM where its kernel accounting names the kernel a native runs: a CUTLASS
    scaled-mm kernel other than the block-wise one (which ``cutlass_scaled_mm`` picks by card, as
    the native does) for the scaled GEMM; for the block-scale one its Triton block GEMM, or its
    CUTLASS block-wise one. vLLM chooses among several FP8 GEMMs by card and shape, so without the
    accounting the kernel is not known. vLLM's activation quantizations (``QuantFP8``, a custom op)
    inside its compiled forward are Inductor's code, fused into the kernel of the norm or SwiGLU
    before them (H200: ``triton_red_fused__to_copy_abs_clamp_...``), unless the accounting names
    another kernel for them (a fusion pass's ``_C`` norm-and-quant kernel); the per-token-group one
    is left unnamed, as vLLM's fusion passes put it into ``_C`` kernels."""
    if run.framework == "vLLM" and definition.op_type in _INDUCTOR_QUANT and "compiled" in run.execution:
        if all(k.startswith("triton_") for k in run.kernels):
            return EngineKernel("torch_compile", "Inductor's generated kernel (vLLM's compiled forward; it fuses the "
                                                 "quantization into the kernel of the layer before it)")
    if run.framework == "SGLang" and run.kernels:
        return _sglang_engine_kernel(run, definition)
    if run.framework != "vLLM" or not run.kernels:
        return None
    if definition.op_type == "gemm_fp8_scaled" and any("cutlass" in k and "blockwise" not in k for k in run.kernels):
        return EngineKernel("vllm_cutlass", "vLLM's CUTLASS scaled-mm (the kernel its accounting names)")
    if definition.op_type == "gemm_fp8_block_scale" and run.launched(_VLLM_TRITON_BLOCK_KERNEL):
        return EngineKernel("vllm_triton", "vLLM's Triton block-FP8 GEMM (the kernel its accounting names)")
    if (definition.op_type == "gemm_fp8_block_scale" and _cutlass_blocks(definition)
            and any("cutlass" in k and "blockwise" in k for k in run.kernels)):
        return EngineKernel("vllm_cutlass", "vLLM's CUTLASS block-FP8 GEMM (the kernel its accounting names)")
    return None


def _sglang_engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """SGLang's FP8 kernels where its accounting names the one a native runs: sgl-kernel's CUTLASS
    GEMM (``cutlass_3x_gemm_sm90_fp8``, outside vLLM's namespace) for a per-token / per-channel
    scaled GEMM, and its per-token quantization kernels."""
    if (definition.op_type == "gemm_fp8_scaled" and _per_token_channel(definition)
            and any("cutlass_3x_gemm" in k and "vllm::" not in k for k in run.kernels)):
        return EngineKernel("sglang_cutlass", "SGLang's CUTLASS FP8 GEMM (sgl-kernel's fp8_scaled_mm, the kernel its "
                                              "accounting names)")
    if definition.op_type == "quant_fp8_per_token" and any("per_token_quant_fp8" in k for k in run.kernels):
        return EngineKernel("sglang", "SGLang's per-token FP8 quantization (sgl-kernel's sgl_per_token_quant_fp8, "
                                      "the kernel its accounting names)")
    if (definition.op_type == "quant_fp8_per_token_group" and _sglang_natives_fit(definition)
            and any("per_token_group_quant" in k for k in run.kernels)):
        return EngineKernel("sglang", "SGLang's per-token-group FP8 quantization (the kernel its accounting names)")
    if definition.op_type == "gemm_fp8_block_scale" and any(k.startswith(_SGLANG_TRITON_BLOCK_KERNEL)
                                                              for k in run.kernels):
        return EngineKernel("sglang_triton", "SGLang's Triton block-FP8 GEMM (the kernel its accounting names)")
    return None


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("gemm_fp8_block_scale", "quant_fp8_per_token_group", "gemm_fp8_scaled", "quant_fp8_per_tensor",
              "quant_fp8_per_token", "quant_fp8_static_per_tensor"),
    templates=(GEMM_TEMPLATE, QUANT_TEMPLATE, *SCALED_TEMPLATES.values(), *DYNAMIC_QUANT_TEMPLATES.values(),
               STATIC_QUANT_TEMPLATE),
    baselines=(Baseline("torch_gemm_fp8_block_scale.py", constants=("BLOCK_N", "BLOCK_K"),
                        op_type="gemm_fp8_block_scale"),
               Baseline("torch_quant_fp8_per_token_group.py", constants=("GROUP_SIZE", "POWER_OF_TWO_SCALES"),
                        op_type="quant_fp8_per_token_group"),
               Baseline("torch_gemm_fp8_scaled.py", op_type="gemm_fp8_scaled"),
               Baseline("torch_quant_fp8_per_tensor.py", op_type="quant_fp8_per_tensor"),
               Baseline("torch_quant_fp8_per_token.py", op_type="quant_fp8_per_token"),
               Baseline("torch_quant_fp8_static_per_tensor.py", op_type="quant_fp8_static_per_tensor")),
    natives=_natives,
    engine_kernel=_engine_kernel,
    flops=lambda definition, axes: matmul_flops(definition, axes) if definition.op_type.startswith("gemm") else None,
    atol_of_largest=("gemm_fp8_block_scale", "gemm_fp8_scaled"),
    # the GEMM family's words, exactly, so that the kernel accounting takes their kernels as one
    # family's (FP8 GEMM kernels are named as GEMMs are); the activation quantization's kernels are
    # named after it (SGLang's ``per_token_quant_fp8_small_batch_kernel`` and
    # ``per_token_group_quant_8bit_v2_kernel``, vLLM's ``dynamic_per_token_scaled_fp8_quant_kernel``
    # and the per-tensor scale's ``segmented_max_reduction``), never a GEMM's: a GEMM kernel in a
    # layer's range or graph is its GEMM's, not shared with the quantization before it
    kernel_words=gemm.FAMILY.kernel_words,
    continue_words=gemm.FAMILY.continue_words,
    op_kernel_words={op_type: ("quant", "max_reduction") for op_type in
                     ("quant_fp8_per_token_group", "quant_fp8_per_tensor", "quant_fp8_per_token",
                      "quant_fp8_static_per_tensor")},
)
