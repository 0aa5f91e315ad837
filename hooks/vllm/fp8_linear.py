"""vLLM's FP8 linear layers (``Fp8LinearMethod``) as the ``fp8_linear`` family's calls.

With block-scale weights (DeepSeek-V3/R1, Qwen3-FP8: ``weight_block_size``) vLLM's method hands
the layer to a block-scaled kernel (``Fp8BlockScaledMMLinearKernel``: DeepGEMM, CUTLASS, Triton,
...) whose ``apply_weights`` quantizes the activations per token and group of ``block_k`` columns
(``QuantFP8``), then runs the block-scale GEMM: two calls per layer and step, whichever kernel. A
kernel that takes the bf16 input itself (FlashInfer's), runs its own ``apply_weights`` (vLLM's CPU
kernels), or quantizes with power-of-two (UE8M0) scales, Marlin's weight-only FP8, per-tensor or
per-channel scales (no hook yet), a bias (added by its own kernel after the GEMM) or vLLM's
batch-invariant mode are another computation: the layer is listed by what it is.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from fi_profile.capture.kernel_call import rows
from fi_profile.capture.layers import LayerRule, recorded_elsewhere, require, seen
from fi_profile.families import fp8_linear, gemm

BASE = "vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod"
#: the block-scaled kernels' base, whose ``apply_weights`` is the quantization, then the GEMM
_BLOCK_KERNEL = "Fp8BlockScaledMMLinearKernel"


def _block_kernel_problem(kernel: Any) -> Optional[str]:
    """Why ``kernel`` (the method's ``fp8_linear``) is not the base's quantization then GEMM, or None."""
    bases = {cls.__name__: cls for cls in type(kernel).__mro__}
    name = type(kernel).__name__
    if _BLOCK_KERNEL not in bases:
        return f"{name} (not a block-scaled kernel)"
    if type(kernel).apply_weights is not bases[_BLOCK_KERNEL].apply_weights:
        return f"{name}'s own apply_weights"
    if not getattr(kernel, "apply_input_quant", True):
        return f"{name}, which takes the bf16 input and quantizes it itself"
    quant = getattr(kernel, "quant_fp8", None)
    if quant is None or getattr(quant, "static", False):
        return f"{name} with static activation scales"
    if getattr(quant, "use_ue8m0", False):
        return f"{name} with power-of-two (UE8M0) scales"
    return None


@functools.lru_cache(maxsize=None)  # a process constant: read once, not on every hooked call
def _batch_invariant() -> bool:
    try:
        import vllm.envs as envs
    except Exception:  # noqa: BLE001 - no vLLM here: its default
        return False
    return bool(getattr(envs, "VLLM_BATCH_INVARIANT", False))


def layer_problem(layer: Any) -> Optional[str]:
    """Why an FP8 linear layer is not the two block-scale calls, or None."""
    method = layer.quant_method
    block = getattr(method, "weight_block_size", None) if getattr(method, "block_quant", False) else None
    found = [what for what, applies in {
        "Marlin (weight-only FP8)": bool(getattr(method, "use_marlin", False)),
        "per-tensor or per-channel weight scales (no hook yet)": block is None,
        "a bias": getattr(layer, "bias", None) is not None,
        "vLLM's batch-invariant mode": _batch_invariant(),
    }.items() if applies]
    if block is not None and not found:
        kernel = _block_kernel_problem(getattr(method, "fp8_linear", None))
        found += [kernel] if kernel else []
    if found:
        return f"{type(layer).__name__} with {type(method).__name__}: {', '.join(found)} (no Definition computes it)"
    return None


def linear_calls(self: Any, layer: Any, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> list:
    """``Fp8LinearMethod.apply(layer, x, bias)`` with block-scale weights: the per-token-group
    quantization of ``x``, then the block-scale GEMM (the layer's logical sizes, never its weight's,
    which the kernels repack)."""
    seen(layer)
    require(layer_problem(layer))
    if bias is not None:
        raise NotImplementedError("an FP8 block-scale linear layer with a bias (no Definition computes it)")
    if recorded_elsewhere(layer):
        return []
    return sized_calls(layer, rows(x, gemm.layer_size(layer)[1]), x.dtype)


def sized_calls(layer: Any, m: int, dtype: torch.dtype) -> list:
    """A block-scale FP8 layer's two calls on ``m`` tokens of ``dtype`` (where another hook records
    the layer: vLLM's MoE, for shared experts inside its opaque op)."""
    n, k = gemm.layer_size(layer)
    block = layer.quant_method.weight_block_size
    return [fp8_linear.quant_call(m, k, int(block[1]), dtype), fp8_linear.block_gemm_call(m, n, k, block, dtype)]


LAYER_RULE = LayerRule(BASE, layer_problem)
