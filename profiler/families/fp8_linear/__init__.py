"""FP8 linear layers with 128x128 block-scale weights (DeepSeek-V3/R1, Qwen3-FP8), as the engines
run them: two kernels per layer and step. First the activations are quantized by their own kernel
(dynamic, per token and group of ``block_k`` columns: op type ``quant_fp8_per_token_group``), then
the FP8 GEMM multiplies them with the checkpoint's FP8 weight, each operand dequantized by its
scales (op type ``gemm_fp8_block_scale``, bfloat16 result). The scales are inputs of the
Definitions, so a Solution sees exactly what the engine's kernel sees.

References dequantize in float32; an FP8 GEMM's output is a sum of K rounded products, so its check
takes bfloat16's atol relative to the reference's largest magnitude (``Family.atol_of_largest``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import SHORT_DTYPES, KernelCall, cached_definition, rows
from fi_profile.families import gemm
from fi_profile.families.family import Baseline, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "fp8_linear"
GEMM_TEMPLATE = "gemm_fp8_block_scale_n7168_k2048"
QUANT_TEMPLATE = "quant_fp8_per_token_group_k7168_g128"
#: the block shape of the templates (DeepSeek-V3's ``weight_block_size``)
BLOCK = (128, 128)


def _blocks(size: int, block: int) -> int:
    return -(-size // block)


def _block_suffix(block: Sequence[int]) -> str:
    return "" if tuple(block) == BLOCK else f"_b{block[0]}x{block[1]}"


def quant_call(m: int, k: int, group_size: int, dtype: torch.dtype) -> KernelCall:
    """The activation quantization before an FP8 block-scale GEMM: ``m`` tokens of ``k`` values in
    groups of ``group_size``."""

    def build() -> Definition:
        if k % group_size:
            raise NotImplementedError(f"per-token-group FP8 quantization of {k} columns in groups of {group_size}")
        schema = schema_dtype(dtype)
        suffix = "" if schema.value == "bfloat16" else f"_{SHORT_DTYPES.get(schema, schema.value)}"
        return definition_for(QUANT_TEMPLATE, f"quant_fp8_per_token_group_k{k}_g{group_size}{suffix}",
                              {"K": k, "num_groups": k // group_size}, schema, {"GROUP_SIZE": group_size})

    definition = cached_definition(("quant_fp8_per_token_group", k, group_size, dtype), build)
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


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("gemm_fp8_block_scale", "quant_fp8_per_token_group"),
    templates=(GEMM_TEMPLATE, QUANT_TEMPLATE),
    baselines=(Baseline("torch_gemm_fp8_block_scale.py", constants=("BLOCK_N", "BLOCK_K"),
                        op_type="gemm_fp8_block_scale"),
               Baseline("torch_quant_fp8_per_token_group.py", constants=("GROUP_SIZE",),
                        op_type="quant_fp8_per_token_group")),
    atol_of_largest=("gemm_fp8_block_scale",),
    # the GEMM family's words, exactly, so that the kernel accounting takes their kernels as one
    # family's (FP8 GEMM kernels are named as GEMMs are); the quantization kernel's own words come
    # with the hooks that record it (none yet), with the accounting telling it from the GEMM
    kernel_words=gemm.FAMILY.kernel_words,
)
