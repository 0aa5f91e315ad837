"""vLLM's FP8 linear layers (``Fp8LinearMethod``, compressed-tensors' W8A8 FP8 scheme) as the
``fp8_linear`` family's calls.

With block-scale weights (DeepSeek-V3/R1, Qwen3-FP8: ``weight_block_size``) vLLM's method hands
the layer to a block-scaled kernel (``Fp8BlockScaledMMLinearKernel``: DeepGEMM, CUTLASS, Triton,
...) whose ``apply_weights`` quantizes the activations per token and group of ``block_k`` columns
(``QuantFP8``), then runs the block-scale GEMM: two calls per layer and step, whichever kernel.
Without blocks (Llama-3.1-8B-FP8: per-tensor or per-channel weight scales) it hands it to a scaled-mm
kernel (``FP8ScaledMMLinearKernel``: CUTLASS, FlashInfer, PyTorch's ``_scaled_mm``) whose
``apply_weights`` likewise quantizes the activations dynamically, per tensor or per token, then
runs the scaled GEMM. Where vLLM rounds the activation scales up to powers of two for DeepGEMM
(UE8M0, its default on Hopper and Blackwell with DeepGEMM) the quantization is that Definition's
(``quant_fp8_per_token_group_ue8m0_*``). A kernel that takes the bf16 input itself (FlashInfer's
block kernel), runs its own ``apply_weights`` (vLLM's CPU kernels), or quantizes with the
checkpoint's static activation scales, Marlin's weight-only FP8, a bias (added by its own
kernel after the GEMM) or vLLM's batch-invariant mode are another computation: the layer is listed
by what it is.

Compressed-tensors checkpoints (``quant_method: compressed-tensors``: the FP8-dynamic releases of
Llama, Qwen3 and others) run their layers through ``CompressedTensorsLinearMethod``, which hands each
to the layer's scheme: ``CompressedTensorsW8A8Fp8`` holds the same FP8 kernels (``fp8_linear``) and
is recorded as above; any other scheme (W8A8 int8, W4A16, NVFP4, ...) is listed by its name.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import torch

from fi_profile.capture.kernel_call import rows
from fi_profile.capture.layers import LayerRule, recorded_elsewhere, require, seen
from fi_profile.families import fp8_linear, gemm

BASE = "vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod"
#: compressed-tensors' linear method, which runs each layer through the layer's own scheme
COMPRESSED_TENSORS = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors:" \
    "CompressedTensorsLinearMethod"
#: the block-scaled kernels' base, whose ``apply_weights`` is the quantization, then the GEMM
_BLOCK_KERNEL = "Fp8BlockScaledMMLinearKernel"
#: the scaled-mm kernels' base (per-tensor or per-channel weight scales), likewise
_SCALED_KERNEL = "FP8ScaledMMLinearKernel"


def _base_problem(kernel: Any, base: str, kind: str) -> Optional[str]:
    """Why ``kernel`` (the method's ``fp8_linear``) does not run ``base``'s ``apply_weights`` (the
    dynamic activation quantization, then the GEMM), or None."""
    bases = {cls.__name__: cls for cls in type(kernel).__mro__}
    name = type(kernel).__name__
    if base not in bases:
        return f"{name} (not a {kind} kernel)"
    if type(kernel).apply_weights is not bases[base].apply_weights:
        return f"{name}'s own apply_weights"
    if not getattr(kernel, "apply_input_quant", True):
        return f"{name}, which takes the bf16 input and quantizes it itself"
    quant = getattr(kernel, "quant_fp8", None)
    if quant is None or getattr(quant, "static", False):
        return f"{name} with static activation scales"
    return None


def _block_kernel_problem(kernel: Any) -> Optional[str]:
    """Why ``kernel`` is not the base's per-token-group quantization then block-scale GEMM, or None."""
    return _base_problem(kernel, _BLOCK_KERNEL, "block-scaled")


@functools.lru_cache(maxsize=None)  # a process constant: read once, not on every hooked call
def _batch_invariant() -> bool:
    try:
        import vllm.envs as envs
    except Exception:  # noqa: BLE001 - no vLLM here: its default
        return False
    return bool(getattr(envs, "VLLM_BATCH_INVARIANT", False))


def _per(group_shape: Any, kinds: dict[tuple[int, int], str]) -> Optional[str]:
    """A vLLM ``GroupShape`` (row, col) as the scale granularity ``kinds`` names, or None."""
    try:
        return kinds.get((int(group_shape[0]), int(group_shape[1])))
    except (TypeError, IndexError, ValueError):
        return None


_ACTIVATION_SCALES = {(-1, -1): "tensor", (1, -1): "token"}
_WEIGHT_SCALES = {(-1, -1): "tensor", (-1, 1): "channel"}


def scaled_kinds(kernel: Any) -> Optional[tuple[str, str]]:
    """A scaled-mm kernel's (activation scales per, weight scales per), from its configuration's
    quantization keys (never from the weight's scale tensor, which a kernel may reshape), or None."""
    config = getattr(kernel, "config", None)
    activation = getattr(getattr(getattr(config, "activation_quant_key", None), "scale", None), "group_shape", None)
    weight = getattr(getattr(getattr(config, "weight_quant_key", None), "scale", None), "group_shape", None)
    kinds = (_per(activation, _ACTIVATION_SCALES), _per(weight, _WEIGHT_SCALES))
    return kinds if None not in kinds else None


def _scaled_kernel_problem(kernel: Any) -> Optional[str]:
    """Why ``kernel`` (without weight blocks) is not the base's dynamic quantization per tensor or
    token then scaled GEMM, or None."""
    problem = _base_problem(kernel, _SCALED_KERNEL, "scaled-mm")
    if problem is None and scaled_kinds(kernel) is None:
        return f"{type(kernel).__name__} with scales of another granularity than per tensor, token or channel"
    return problem


def _group_size(kernel: Any, block: Sequence[int]) -> int:
    """The columns per activation scale the kernel's quantization takes (its ``QuantFP8``'s own
    group, which vLLM's compressed-tensors scheme sets from the weight block's first side)."""
    return int(getattr(getattr(kernel, "quant_fp8", None), "group_size", None) or block[1])


def layer_problem(layer: Any) -> Optional[str]:
    """Why an FP8 linear layer is not its activation quantization then its FP8 GEMM, or None."""
    runner = fp8_linear.layer_runner(layer)
    scheme = fp8_linear.unknown_scheme(layer, runner)
    if scheme is not None:
        return scheme
    block = fp8_linear.weight_blocks(runner)
    kernel = getattr(runner, "fp8_linear", None)
    found = [what for what, applies in {
        "Marlin (weight-only FP8)": bool(getattr(runner, "use_marlin", False)),
        "a bias": getattr(layer, "bias", None) is not None,
        "vLLM's batch-invariant mode": _batch_invariant(),
    }.items() if applies]
    if not found:
        problem = _block_kernel_problem(kernel) if block is not None else _scaled_kernel_problem(kernel)
        group = _group_size(kernel, block) if problem is None and block is not None else None
        if group is not None and group != int(block[1]):
            problem = f"activation groups of {group} columns beside {list(block)} weight blocks"
        found += [problem] if problem else []
    if found:
        return (f"{type(layer).__name__} with {fp8_linear.runner_name(layer, runner)}: {', '.join(found)} "
                "(no Definition computes it)")
    return None


def linear_calls(self: Any, layer: Any, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> list:
    """``Fp8LinearMethod.apply(layer, x, bias)`` (or ``CompressedTensorsLinearMethod.apply``'s, for its
    W8A8 FP8 scheme): the quantization of ``x`` (per token and group of
    ``block_k`` columns with block-scale weights, else dynamically per tensor or per token), then
    the FP8 GEMM (the layer's logical sizes, never its weight's, which the kernels repack). An input
    an earlier op already quantized (vLLM's fusion of the quantization into the norm before it)
    records the GEMM alone."""
    seen(layer)
    require(layer_problem(layer))
    if bias is not None:
        raise NotImplementedError("an FP8 linear layer with a bias (no Definition computes it)")
    if recorded_elsewhere(layer):
        return []
    k = gemm.layer_size(layer)[1]
    if isinstance(x, torch.Tensor):
        return sized_calls(layer, rows(x, k), x.dtype)
    data, dtype = getattr(x, "data", None), getattr(x, "orig_dtype", None)
    if not isinstance(data, torch.Tensor) or dtype is None:
        raise NotImplementedError(f"an FP8 linear layer handed a {type(x).__name__} (no Definition computes it)")
    return sized_calls(layer, rows(data, k), dtype)[1:]


def sized_calls(layer: Any, m: int, dtype: torch.dtype) -> list:
    """An FP8 layer's two calls on ``m`` tokens of ``dtype`` (also where another hook records the
    layer: vLLM's MoE, for shared experts inside its opaque op)."""
    n, k = gemm.layer_size(layer)
    runner = fp8_linear.layer_runner(layer)
    block = fp8_linear.weight_blocks(runner)
    if block is not None:
        # DeepGEMM's power-of-two (UE8M0) scales where vLLM uses them (Hopper and Blackwell with
        # DeepGEMM: vLLM's default there): the quantization's own Definition, the same GEMM after it
        power_of_two = bool(getattr(runner.fp8_linear.quant_fp8, "use_ue8m0", False))
        return [fp8_linear.quant_call(m, k, int(block[1]), dtype, power_of_two),
                fp8_linear.block_gemm_call(m, n, k, block, dtype)]
    activation, weight = scaled_kinds(runner.fp8_linear)
    return [fp8_linear.dynamic_quant_call(m, k, activation, dtype),
            fp8_linear.scaled_gemm_call(m, n, k, activation, weight, dtype)]


LAYER_RULE = LayerRule(BASE, layer_problem)
#: compressed-tensors' layers: those of its W8A8 FP8 scheme judged as above, others listed by scheme
COMPRESSED_TENSORS_RULE = LayerRule(COMPRESSED_TENSORS, layer_problem)
