try:
    import vllm._moe_C  # noqa: F401  registers torch.ops._moe_C (top-k, block alignment): CPU builds
except ImportError:
    import vllm._moe_C_stable_libtorch  # noqa: F401  the same ops in CUDA builds on the stable ABI
from vllm.model_executor.layers.fused_moe import fused_experts, fused_topk

top_k = 2
RENORMALIZE = True


def run(hidden_states, routing_logits, gemm1_weights, gemm2_weights):
    """vLLM's fused MoE for unquantized experts: its softmax top-k router kernel, then the fused
    Triton experts (gate/up GEMM, SwiGLU, down GEMM, weighted sum), as FusedMoE runs them."""
    weights, ids, _ = fused_topk(hidden_states, routing_logits, top_k, RENORMALIZE)
    return fused_experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids)
