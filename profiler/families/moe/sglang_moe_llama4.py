import torch
from sglang_fused_experts import experts

top_k = 1
WEIGHT_ON_INPUT = True


def run(hidden_states, routing_logits, gemm1_weights, gemm2_weights):
    """SGLang's fused MoE as it runs Llama-4's layers: its ``Llama4MoE.custom_routing_function``
    (the top-k logits, by ``fast_topk``, through a sigmoid in float32, rounded to the input's
    dtype), then its Triton experts in place on the layer input with the weight applied to their
    input (``apply_router_weight_on_input``)."""
    if top_k == 1:
        logits, ids = torch.max(routing_logits, dim=-1, keepdim=True)
    else:
        logits, ids = torch.topk(routing_logits, top_k, dim=-1)
    weights = torch.sigmoid(logits.float()).to(hidden_states.dtype)
    return experts(hidden_states, gemm1_weights, gemm2_weights, weights, ids.to(torch.int32), routing_logits,
                   num_experts=routing_logits.shape[-1], apply_router_weight_on_input=WEIGHT_ON_INPUT)
