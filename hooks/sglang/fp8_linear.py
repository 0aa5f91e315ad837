"""SGLang's FP8 linear layers (``Fp8LinearMethod``, and compressed-tensors' W8A8 FP8 scheme, which
runs the same kernels) as the ``fp8_linear`` family's calls: two per layer and step, the
activations' quantization, then the FP8 GEMM.

- 128x128 block-scale weights (DeepSeek-V3/R1, Qwen3-FP8 checkpoints: ``weight_block_size``):
  SGLang quantizes the activations per token and group of ``block_k`` columns and runs the
  block-scale GEMM, whichever backend it dispatched to (DeepGEMM, Triton, CUTLASS, FlashInfer,
  AITER: the same computation);
- without blocks (``quant_method: fp8``), dynamic activations on CUDA: ``apply_fp8_linear``
  quantizes per token, then the FP8 GEMM with the layer's weight scales, one per output channel
  (as SGLang keeps them for CUTLASS) or one for the tensor.

What it runs otherwise is another computation and the layer is listed by what it is (or, where
only the call tells, the hook error names it): Marlin's weight-only FP8, MXFP8, the AMX CPU kernel,
DeepGEMM's power-of-two (UE8M0) scales, a bias, static activation scales, an FP8 GEMM without
blocks off CUDA, an input the layer before quantized (a tuple); a compressed-tensors layer of
another scheme (W8A8 int8, W4A16, NVFP4, ...) by its scheme's name.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Optional

import torch

from fi_profile.capture.layers import LayerRule, recorded_elsewhere, require, seen
from fi_profile.families import fp8_linear, gemm

BASE = "sglang.srt.layers.quantization.fp8:Fp8LinearMethod"
#: compressed-tensors' linear method, which runs each layer through the layer's own scheme
COMPRESSED_TENSORS = "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors:" \
    "CompressedTensorsLinearMethod"


@functools.lru_cache(maxsize=None)  # a process constant: read once, not on every hooked call
def ue8m0_scales() -> bool:
    """Whether SGLang's DeepGEMM quantizes with power-of-two (UE8M0) scales (Blackwell)."""
    try:
        wrapper = importlib.import_module("sglang.srt.layers.deep_gemm_wrapper")
    except Exception:  # noqa: BLE001 - a build without DeepGEMM: never
        return False
    return bool(getattr(wrapper, "ENABLE_JIT_DEEPGEMM", False) and getattr(wrapper, "DEEPGEMM_SCALE_UE8M0", False))


def _weight_scales(layer: Any) -> str:
    """A layer's weight scales without blocks, as ``apply_fp8_linear`` tells them apart: one per
    output channel, or one for the tensor."""
    scale = getattr(layer, "weight_scale", None)
    n, _ = gemm.layer_size(layer)
    return "channel" if scale is not None and scale.numel() == n else "tensor"


def _on_cuda(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.version.hip is None


def _cuda_weight(layer: Any) -> bool:
    """Whether the layer's weight lives on a CUDA device (its device, never its packed shape)."""
    weight = getattr(layer, "weight", None)
    return weight is None or _on_cuda(weight)


def layer_problem(layer: Any) -> Optional[str]:
    """Why an FP8 linear layer is not the two calls, or None."""
    runner = fp8_linear.layer_runner(layer)
    scheme = fp8_linear.unknown_scheme(layer, runner)
    if scheme is not None:
        return scheme
    block = fp8_linear.weight_blocks(runner)
    found = [what for what, applies in {
        "Marlin (weight-only FP8)": bool(getattr(runner, "use_marlin", False)),
        "MXFP8": bool(getattr(runner, "use_mxfp8", False)),
        "the AMX CPU kernel": bool(getattr(layer, "use_intel_amx_backend", False)),
        "DeepGEMM's power-of-two (UE8M0) scales": block is not None and ue8m0_scales(),
        "a bias": getattr(layer, "bias", None) is not None,
        "static activation scales": block is None and getattr(layer, "input_scale", None) is not None,
        # elsewhere SGLang quantizes per tensor (HIP) or per token-group of all columns
        "no blocks, off CUDA": block is None and not _cuda_weight(layer),
    }.items() if applies]
    if found:
        return (f"{type(layer).__name__} with {fp8_linear.runner_name(layer, runner)}: {', '.join(found)} "
                "(no Definition computes it)")
    return None


def linear_calls(self: Any, layer: Any, x: Any, bias: Optional[torch.Tensor] = None) -> list:
    """``Fp8LinearMethod.apply(layer, x, bias)`` (or ``CompressedTensorsLinearMethod.apply``'s, for
    its W8A8 FP8 scheme): the quantization of ``x`` (per token and group with block-scale weights,
    per token without blocks), then the FP8 GEMM (the layer's logical sizes, never its packed
    weight's)."""
    seen(layer)
    require(layer_problem(layer))
    if isinstance(x, tuple):
        raise NotImplementedError("an FP8 linear layer handed an input the layer before quantized (no Definition "
                                  "computes that layer's quantization)")
    if bias is not None:
        raise NotImplementedError("an FP8 linear layer with a bias (no Definition computes it)")
    if recorded_elsewhere(layer):
        return []
    n, k = gemm.layer_size(layer)
    block = fp8_linear.weight_blocks(fp8_linear.layer_runner(layer))
    if block is not None:
        return fp8_linear.block_linear_calls(x, n, k, block)
    if not _on_cuda(x):
        raise NotImplementedError(f"an FP8 linear layer without blocks on {x.device.type} (no Definition computes "
                                  "its quantization there)")
    return fp8_linear.scaled_linear_calls(x, n, k, "token", _weight_scales(layer))


LAYER_RULE = LayerRule(BASE, layer_problem)
#: compressed-tensors' layers: those of its W8A8 FP8 scheme judged as above, others listed by scheme
COMPRESSED_TENSORS_RULE = LayerRule(COMPRESSED_TENSORS, layer_problem)
