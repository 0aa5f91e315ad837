from sglang.kernels.ops.moe.fused_moe_triton_kernels import fused_append_shared_experts_with_weights
from sglang.srt.layers.moe.topk import fused_topk
from sglang_fused_experts import experts

top_k = 10
RENORMALIZE = True


def run(hidden_states, routing_logits, shared_gate_logits, gemm1_weights, gemm2_weights):
    """SGLang's fused MoE with the shared experts fused in, as its Qwen2-MoE block runs it on CUDA
    (Qwen3-Next's default): its softmax top-k router kernel, the sigmoid of the shared gate's
    logits, each token's shared slots appended with those weights, then its Triton experts over the
    routed and shared experts' weights, in place on the layer input."""
    routed, shared = routing_logits.shape[-1], shared_gate_logits.shape[-1]
    weights, ids = fused_topk(hidden_states, routing_logits, top_k, RENORMALIZE)
    shared_weights = shared_gate_logits.sigmoid()
    ids, weights = fused_append_shared_experts_with_weights(ids, weights, shared_weights, shared, N=routed)
    return experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids, routing_logits, num_experts=routed,
                   shared_experts=shared)
