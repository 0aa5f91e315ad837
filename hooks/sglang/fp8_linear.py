"""SGLang's FP8 linear layers (``Fp8LinearMethod``) as the ``fp8_linear`` family's calls.

With 128x128 block-scale weights (DeepSeek-V3/R1, Qwen3-FP8 checkpoints: ``weight_block_size``)
SGLang's ``apply`` quantizes the activations per token and group of ``block_k`` columns and runs the
block-scale GEMM, whichever backend it dispatched to (DeepGEMM, Triton, CUTLASS, FlashInfer, AITER:
the same computation): two calls per layer and step. What it runs otherwise is another computation
and the layer is listed by what it is: Marlin's weight-only FP8, MXFP8, the AMX CPU kernel,
DeepGEMM's power-of-two (UE8M0) scales, a bias, per-tensor or per-channel weight scales (no hook
yet), an input the layer before quantized (a tuple).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch

from fi_profile.capture.layers import LayerRule, recorded_elsewhere, require, seen
from fi_profile.families import fp8_linear, gemm

BASE = "sglang.srt.layers.quantization.fp8:Fp8LinearMethod"


def _ue8m0_scales() -> bool:
    """Whether SGLang's DeepGEMM quantizes with power-of-two (UE8M0) scales (Blackwell)."""
    try:
        wrapper = importlib.import_module("sglang.srt.layers.deep_gemm_wrapper")
    except Exception:  # noqa: BLE001 - a build without DeepGEMM: never
        return False
    return bool(getattr(wrapper, "ENABLE_JIT_DEEPGEMM", False) and getattr(wrapper, "DEEPGEMM_SCALE_UE8M0", False))


def layer_problem(layer: Any) -> Optional[str]:
    """Why an FP8 linear layer is not the two block-scale calls, or None."""
    method = layer.quant_method
    block = getattr(method, "weight_block_size", None) if getattr(method, "block_quant", False) else None
    found = [what for what, applies in {
        "Marlin (weight-only FP8)": bool(getattr(method, "use_marlin", False)),
        "MXFP8": bool(getattr(method, "use_mxfp8", False)),
        "the AMX CPU kernel": bool(getattr(layer, "use_intel_amx_backend", False)),
        "per-tensor or per-channel weight scales (no hook yet)": block is None,
        "DeepGEMM's power-of-two (UE8M0) scales": block is not None and _ue8m0_scales(),
        "a bias": getattr(layer, "bias", None) is not None,
    }.items() if applies]
    if found:
        return f"{type(layer).__name__} with {type(method).__name__}: {', '.join(found)} (no Definition computes it)"
    return None


def linear_calls(self: Any, layer: Any, x: Any, bias: Optional[torch.Tensor] = None) -> list:
    """``Fp8LinearMethod.apply(layer, x, bias)`` with block-scale weights: the per-token-group
    quantization of ``x``, then the block-scale GEMM (the layer's logical sizes, never its packed
    weight's)."""
    seen(layer)
    require(layer_problem(layer))
    if isinstance(x, tuple):
        raise NotImplementedError("an FP8 linear layer handed an input the layer before quantized (no Definition "
                                  "computes that layer's quantization)")
    if bias is not None:
        raise NotImplementedError("an FP8 block-scale linear layer with a bias (no Definition computes it)")
    if recorded_elsewhere(layer):
        return []
    n, k = gemm.layer_size(layer)
    return fp8_linear.block_linear_calls(x, n, k, self.weight_block_size)


LAYER_RULE = LayerRule(BASE, layer_problem)
