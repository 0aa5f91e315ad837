try:
    import vllm._moe_C  # noqa: F401  registers torch.ops._moe_C (top-k, block alignment): CPU builds
except ImportError:
    import vllm._moe_C_stable_libtorch  # noqa: F401  the same ops in CUDA builds on the stable ABI
from vllm.model_executor.layers.fused_moe import fused_topk
from vllm_fp8_experts import experts, layer_input

TOP_K = 8


def run(routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
        gemm2_weights_scale):
    """vLLM's MoE with FP8 block-scale experts and a renormalizing softmax top-k router (Qwen3's),
    as its Triton FP8 backend runs it, on the FP8 input."""
    x = layer_input(hidden_states)
    weights, ids, _ = fused_topk(x, routing_logits, TOP_K, True)
    return experts(x, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
                   gemm2_weights_scale, weights, ids, routing_logits.shape[-1])
