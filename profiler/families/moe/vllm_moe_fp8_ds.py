try:
    import vllm._moe_C  # noqa: F401  registers torch.ops._moe_C (top-k, block alignment): CPU builds
except ImportError:
    import vllm._moe_C_stable_libtorch  # noqa: F401  the same ops in CUDA builds on the stable ABI
from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import grouped_topk
from vllm_fp8_experts import experts, layer_input

TOP_K = 8
N_GROUP = 8
TOPK_GROUP = 4


def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    """vLLM's DeepSeek MoE with FP8 block-scale experts as its Triton FP8 backend runs it: the
    grouped top-k router, then fused_experts on the FP8 input and weights in 128 x 128 blocks."""
    x = layer_input(hidden_states)
    weights, ids = grouped_topk(x, routing_logits, TOP_K, True, num_expert_group=N_GROUP, topk_group=TOPK_GROUP,
                                scoring_func="sigmoid", routed_scaling_factor=float(routed_scaling_factor),
                                e_score_correction_bias=routing_bias)
    return experts(x, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
                   gemm2_weights_scale, weights, ids, routing_logits.shape[-1], local_expert_offset)
