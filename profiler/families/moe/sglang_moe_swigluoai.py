from sglang.srt.layers.moe.topk import fused_topk
from sglang_fused_experts import experts

top_k = 4
RENORMALIZE = True
ALPHA = 1.702
LIMIT = 7.0


def run(hidden_states, routing_logits, gemm1_weights, gemm1_bias, gemm2_weights, gemm2_bias):
    """SGLang's fused MoE for gpt-oss's unquantized experts: its softmax top-k router kernel, then its
    Triton experts with their biases and its gpt-oss SwiGLU (``gemm1_alpha``, ``gemm1_clamp_limit``,
    gate and up interleaved), in place on the layer input."""
    weights, ids = fused_topk(hidden_states, routing_logits, top_k, RENORMALIZE)
    return experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids, routing_logits,
                   num_experts=routing_logits.shape[-1], b1=gemm1_bias, b2=gemm2_bias,
                   swiglu=(ALPHA, LIMIT))
