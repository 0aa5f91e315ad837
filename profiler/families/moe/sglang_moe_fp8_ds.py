import torch
from sglang.srt.layers.moe.topk import biased_grouped_topk_gpu
from sglang_fused_experts import fp8_experts

TOP_K = 8
N_GROUP = 8
TOPK_GROUP = 4


def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    """SGLang's DeepSeek MoE with FP8 block-scale experts as its Triton runner runs them on CUDA: the
    grouped top-k router (a slot per fused shared expert, weights beyond the routed ones), then
    the fused FP8 experts in 128 x 128 blocks on the FP8 input."""
    x = torch.empty(hidden_states.shape, dtype=torch.bfloat16, device=hidden_states.device)
    routed = routing_logits.shape[-1]
    shared = max(gemm1_weights.shape[0] - routed, 0)
    scaling = float(routed_scaling_factor)
    weights, ids = biased_grouped_topk_gpu(x, routing_logits, routing_bias, TOP_K + shared, True,
                                           num_expert_group=N_GROUP, topk_group=TOPK_GROUP,
                                           num_fused_shared_experts=shared, routed_scaling_factor=scaling)
    return fp8_experts(x, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
                       gemm2_weights_scale, weights, ids, routing_logits, num_experts=routed,
                       routed_scaling_factor=scaling, local_expert_offset=local_expert_offset, shared_experts=shared)
