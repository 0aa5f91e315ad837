"""vLLM's fused FP8 block-scale experts on flashinfer-trace's FP8 MoE interface: vLLM's MoE takes
the bf16 layer input and quantizes it per token group itself (the kernel the capture records as
the quantization Definition), so its quantization of the input is handed the Definition's FP8
input and scales instead; gemm1's [up; gate] is laid out as vLLM's [gate; up], and an expert map
built, once per tensor, outside any timed call."""

import torch
import vllm.model_executor.layers.fused_moe.fused_moe as vllm_fused_moe
from expert_layout import expert_map, gate_up
from vllm.model_executor.layers.fused_moe import fused_experts
from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

BLOCK = 128

_GIVEN = {}
_PLACEHOLDERS = {}
_quantize_input = getattr(vllm_fused_moe, "_fi_profile_quantize_input", vllm_fused_moe.moe_kernel_quantize_input)


def _given_or_quantized(*args, **kwargs):
    """vLLM's quantization of a MoE input, except for the input this module hands it (the
    Definition's FP8 tensor and its scales)."""
    a = kwargs["A"] if "A" in kwargs else args[0]
    given = _GIVEN.get((a.data_ptr(), tuple(a.shape)))
    return given if given is not None else _quantize_input(*args, **kwargs)


vllm_fused_moe._fi_profile_quantize_input = _quantize_input
vllm_fused_moe.moe_kernel_quantize_input = _given_or_quantized


def layer_input(hidden_states):
    """A bf16 tensor of the input's shape for vLLM's router and experts to take (its values are
    never read: the experts get the FP8 input, the routers read only its shape)."""
    key = (tuple(hidden_states.shape), str(hidden_states.device))
    if key not in _PLACEHOLDERS:
        _PLACEHOLDERS.clear()
        _PLACEHOLDERS[key] = torch.zeros(hidden_states.shape, dtype=torch.bfloat16, device=hidden_states.device)
    return _PLACEHOLDERS[key]


def experts(x, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
            gemm2_weights_scale, weights, ids, num_experts, local_expert_offset=0):
    """vLLM's fused_experts on the FP8 input (scales [H / BLOCK, T], taken transposed as vLLM's
    kernel reads them by stride) with the routing ``weights`` and ``ids``; ``x``: :func:`layer_input`."""
    w1, w1_scale = gate_up(gemm1_weights, gemm1_weights_scale)
    config = fp8_w8a8_moe_quant_config(w1_scale=w1_scale, w2_scale=gemm2_weights_scale, block_shape=[BLOCK, BLOCK])
    local = gemm1_weights.shape[0]
    extra = {} if local == num_experts else {
        "global_num_experts": num_experts,
        "expert_map": expert_map(num_experts, local_expert_offset, local, x.device)}
    _GIVEN[(x.data_ptr(), tuple(x.shape))] = (hidden_states, hidden_states_scale.T)
    try:
        return fused_experts(x, w1, gemm2_weights, weights, ids, quant_config=config, **extra)
    finally:
        _GIVEN.clear()

