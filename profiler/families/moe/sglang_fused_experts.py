"""SGLang's fused MoE outside its engine: its Triton experts (``fused_experts``, in place on the
layer input as SGLang's Triton runner runs them) after one of its routers. SGLang's kernels read a
few process-wide server arguments: where no engine published them, its own defaults are published
once (``ServerArgs(model_path="dummy")``, SGLang's boundary for that). FP8 block-scale experts take
the Definition's FP8 input and scales in place of SGLang quantizing the bf16 layer input itself
(the kernel the capture records as the quantization Definition)."""

from expert_layout import expert_map, gate_up
from sglang.kernels.ops.moe import fused_moe_triton_kernels
from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
from sglang.srt.layers.moe.topk import StandardTopKOutput
from sglang.srt.runtime_context import get_context, get_server_args

BLOCK = 128

try:
    get_server_args()
except ValueError:  # no engine in this process
    get_context().override_server_args().install()

#: the FP8 inputs handed to SGLang's kernel, by the address and shape of the tensor it quantizes: one
#: dict for every copy of this module a replay's solutions import (each solution imports its own),
#: kept on SGLang's module, which the patch below serves from whichever copy patched it last
_GIVEN = fused_moe_triton_kernels.__dict__.setdefault("_fi_profile_given", {})
_quantize_input = getattr(fused_moe_triton_kernels, "_fi_profile_quantize_input",
                          fused_moe_triton_kernels.sglang_per_token_group_quant_fp8)


def _given_or_quantized(x, group_size, *args, **kwargs):
    """SGLang's per-token-group quantization of a MoE GEMM's input, except for the input this
    module hands it (the Definition's FP8 tensor and its scales)."""
    given = _GIVEN.get((x.data_ptr(), tuple(x.shape)))
    return given if given is not None else _quantize_input(x, group_size, *args, **kwargs)


fused_moe_triton_kernels._fi_profile_quantize_input = _quantize_input
fused_moe_triton_kernels.sglang_per_token_group_quant_fp8 = _given_or_quantized


def experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids, router_logits, *, num_experts,
            routed_scaling_factor=None, local_expert_offset=0, shared_experts=0, swiglu=None,
            apply_router_weight_on_input=False, **quantization):
    """SGLang's Triton experts in place on ``hidden_states`` (its output afterwards), with the routed
    ``weights`` and ``ids`` (``shared_experts`` fused after the ``num_experts`` routed ones); under
    expert parallelism (fewer weights than experts) the global ids mapped to the rank's from
    ``local_expert_offset`` on, -1 elsewhere, as SGLang's standard dispatcher maps them; ``swiglu``:
    gpt-oss's (alpha, clamp limit) on interleaved gate and up rows, as its runner configuration says;
    ``apply_router_weight_on_input``: the weights scale the experts' input (Llama-4's)."""
    local = gemm1_weights.shape[0]
    if local != num_experts + shared_experts:
        ids = expert_map(num_experts, local_expert_offset, local, ids.device)[ids]
    config = MoeRunnerConfig(num_experts=num_experts + shared_experts, num_local_experts=local,
                             top_k=ids.shape[-1], num_fused_shared_experts=shared_experts, inplace=True,
                             routed_scaling_factor=routed_scaling_factor,
                             apply_router_weight_on_input=apply_router_weight_on_input)
    if swiglu is not None:
        config.gemm1_alpha, config.gemm1_clamp_limit = swiglu
    fused_experts(hidden_states, gemm1_weights, gemm2_weights, StandardTopKOutput(weights, ids, router_logits), config,
                  **quantization)
    return hidden_states


def fp8_experts(x, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
                gemm2_weights_scale, weights, ids, router_logits, **routing):
    """:func:`experts` with FP8 block-scale experts on the Definition's FP8 input (scales
    [H / BLOCK, T], taken transposed as SGLang's kernel reads them by stride); ``x``: a bf16 tensor
    of the input's shape, whose values are never read, which holds the output afterwards."""
    w1, w1_scale = gate_up(gemm1_weights, gemm1_weights_scale)
    _GIVEN[(x.data_ptr(), tuple(x.shape))] = (hidden_states, hidden_states_scale.T)
    try:
        return experts(x, w1, gemm2_weights, weights, ids, router_logits, use_fp8_w8a8=True, w1_scale=w1_scale,
                       w2_scale=gemm2_weights_scale, block_shape=[BLOCK, BLOCK], **routing)
    finally:
        _GIVEN.clear()


def triton_kernels_experts(hidden_states, router_logits, w1, w1_precision, b1, w2, w2_precision, b2, *, top_k,
                           renormalize, swiglu):
    """SGLang's ``triton_kernels`` MoE runner (gpt-oss's on Hopper): its top-k routing into Triton's
    routing data (``sm_first`` unless the weights are renormalized), then ``matmul_ogs`` experts on
    weights laid out [in, out] (bfloat16, or swizzled MXFP4 with their precision configs), with the
    biases and gpt-oss's SwiGLU ``swiglu`` = (alpha, clamp limit). It returns a new tensor."""
    from sglang.srt.layers.moe.fused_moe_triton.triton_kernels_moe import triton_kernel_fused_experts_with_bias
    from sglang.srt.layers.moe.topk import routing

    routing_data, gather, scatter = routing(router_logits, top_k, sm_first=not renormalize)
    return triton_kernel_fused_experts_with_bias(hidden_states, w1, w1_precision, b1, w2, w2_precision, b2, routing_data,
                                                 gather, scatter, gemm1_alpha=swiglu[0], gemm1_clamp_limit=swiglu[1])
