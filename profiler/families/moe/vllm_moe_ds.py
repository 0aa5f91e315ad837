try:
    import vllm._moe_C  # noqa: F401  registers torch.ops._moe_C (top-k, block alignment): CPU builds
except ImportError:
    import vllm._moe_C_stable_libtorch  # noqa: F401  the same ops in CUDA builds on the stable ABI
from expert_layout import expert_map
from vllm.model_executor.layers.fused_moe import fused_experts
from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import grouped_topk

top_k = 8
N_GROUP = 8
TOPK_GROUP = 4
RENORMALIZE = True
ROUTED_SCALING_FACTOR = 2.5


def run(hidden_states, routing_logits, routing_bias, gemm1_weights, gemm2_weights, local_expert_offset=0):
    """vLLM's DeepSeek MoE for unquantized experts: its grouped top-k router (the fused CUDA kernel
    on GPUs, sigmoid scores chosen by the correction bias), the routed scaling on the weights, then
    the fused Triton experts, as its GroupedTopKRouter and FusedMoE run them; under expert
    parallelism with the expert map of vLLM's linear placement (the rank's experts from
    ``local_expert_offset`` on)."""
    weights, ids = grouped_topk(hidden_states, routing_logits, top_k, RENORMALIZE, num_expert_group=N_GROUP,
                                topk_group=TOPK_GROUP, scoring_func="sigmoid",
                                routed_scaling_factor=ROUTED_SCALING_FACTOR, e_score_correction_bias=routing_bias)
    experts, local = routing_logits.shape[-1], gemm1_weights.shape[0]
    if local == experts:
        return fused_experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids)
    return fused_experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids, global_num_experts=experts,
                         expert_map=expert_map(experts, local_expert_offset, local, hidden_states.device))

