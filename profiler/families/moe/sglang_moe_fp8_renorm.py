import torch
from sglang.srt.layers.moe.topk import fused_topk
from sglang_fused_experts import fp8_experts

TOP_K = 8


def run(routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
        gemm2_weights_scale):
    """SGLang's MoE with FP8 block-scale experts and a renormalizing softmax top-k router (Qwen3's),
    as its Triton runner runs them on CUDA, on the FP8 input."""
    x = torch.empty(hidden_states.shape, dtype=torch.bfloat16, device=hidden_states.device)
    weights, ids = fused_topk(x, routing_logits, TOP_K, True)
    return fp8_experts(x, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
                       gemm2_weights_scale, weights, ids, routing_logits, num_experts=routing_logits.shape[-1])
