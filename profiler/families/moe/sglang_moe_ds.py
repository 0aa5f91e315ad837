from sglang.srt.layers.moe.topk import biased_grouped_topk_gpu
from sglang_fused_experts import experts

top_k = 8
N_GROUP = 8
TOPK_GROUP = 4
RENORMALIZE = True
ROUTED_SCALING_FACTOR = 2.5


def run(hidden_states, routing_logits, routing_bias, gemm1_weights, gemm2_weights, local_expert_offset=0):
    """SGLang's DeepSeek MoE for unquantized experts as it runs on CUDA: its grouped top-k router
    (FlashInfer's fused DeepSeek kernel where it fits, else SGLang's own), each token given one more
    slot per shared expert fused after the routed ones, then its Triton experts in place on the
    layer input, their sum times the routed scaling factor."""
    routed = routing_logits.shape[-1]
    shared = max(gemm1_weights.shape[0] - routed, 0)
    weights, ids = biased_grouped_topk_gpu(hidden_states, routing_logits, routing_bias, top_k + shared, RENORMALIZE,
                                           num_expert_group=N_GROUP, topk_group=TOPK_GROUP,
                                           num_fused_shared_experts=shared,
                                           routed_scaling_factor=ROUTED_SCALING_FACTOR)
    return experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids, routing_logits, num_experts=routed,
                   routed_scaling_factor=ROUTED_SCALING_FACTOR, local_expert_offset=local_expert_offset,
                   shared_experts=shared)
