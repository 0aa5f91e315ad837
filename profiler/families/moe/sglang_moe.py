from sglang.srt.layers.moe.topk import fused_topk
from sglang_fused_experts import experts

top_k = 2
RENORMALIZE = True


def run(hidden_states, routing_logits, gemm1_weights, gemm2_weights):
    """SGLang's fused MoE for unquantized experts: its softmax top-k router kernel, then its Triton
    experts in place on the layer input, as its ``TopK`` and ``FusedMoE`` run them on CUDA."""
    weights, ids = fused_topk(hidden_states, routing_logits, top_k, RENORMALIZE)
    return experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids, routing_logits,
                   num_experts=routing_logits.shape[-1])
