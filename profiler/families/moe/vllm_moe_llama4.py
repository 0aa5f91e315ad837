import torch

try:
    import vllm._moe_C  # noqa: F401  registers torch.ops._moe_C (block alignment): CPU builds
except ImportError:
    import vllm._moe_C_stable_libtorch  # noqa: F401  the same ops in CUDA builds on the stable ABI
from vllm.model_executor.layers.fused_moe import fused_experts

top_k = 1
WEIGHT_ON_INPUT = True


def run(hidden_states, routing_logits, gemm1_weights, gemm2_weights):
    """vLLM's fused MoE as it runs Llama-4's layers: ``Llama4MoE.custom_routing_function`` (the
    top-k logits, by ``fast_topk``, through a sigmoid in float32), then the fused Triton experts
    with the weight applied to their input (``apply_router_weight_on_input``)."""
    if top_k == 1:
        logits, ids = torch.max(routing_logits, dim=-1, keepdim=True)
    else:
        logits, ids = torch.topk(routing_logits, top_k, dim=-1)
    weights = torch.sigmoid(logits.float())
    return fused_experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids.to(torch.int32),
                         apply_router_weight_on_input=WEIGHT_ON_INPUT)
