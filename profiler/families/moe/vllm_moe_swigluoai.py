try:
    import vllm._moe_C  # noqa: F401  registers torch.ops._moe_C (top-k, block alignment): CPU builds
except ImportError:
    import vllm._moe_C_stable_libtorch  # noqa: F401  the same ops in CUDA builds on the stable ABI
from vllm.model_executor.layers.fused_moe import fused_experts, fused_topk
from vllm.model_executor.layers.fused_moe.config import biased_moe_quant_config

try:  # vLLM 0.2x's later versions name the experts' activations by an enum
    from vllm.model_executor.layers.fused_moe import MoEActivation

    SWIGLUOAI = MoEActivation.SWIGLUOAI
except ImportError:
    SWIGLUOAI = "swigluoai"

top_k = 4
RENORMALIZE = True


def run(hidden_states, routing_logits, gemm1_weights, gemm1_bias, gemm2_weights, gemm2_bias):
    """vLLM's fused MoE for gpt-oss's unquantized experts: its softmax top-k router kernel, then the
    fused Triton experts with their biases and the ``swigluoai`` activation (its kernel's own alpha
    1.702 and limit 7.0), as MoERunner runs them."""
    weights, ids, _ = fused_topk(hidden_states, routing_logits, top_k, RENORMALIZE)
    return fused_experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids, activation=SWIGLUOAI,
                         quant_config=biased_moe_quant_config(gemm1_bias, gemm2_bias))
