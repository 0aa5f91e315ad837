import torch
import torch.nn.functional as F

top_k = 10
RENORMALIZE = True


def run(hidden_states, routing_logits, shared_gate_logits, gemm1_weights, gemm2_weights):
    """Route, then one pass per expert that got tokens: gathered GEMMs in the input dtype; the shared
    experts after the routed ones take every token, weighted by the sigmoid of their gate's logits."""
    weights, experts = routing_logits.float().softmax(-1).topk(top_k, dim=-1)
    if RENORMALIZE:
        weights = weights / weights.sum(-1, keepdim=True)
    output = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    intermediate = gemm2_weights.shape[-1]
    for e in experts.unique().tolist():
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        gate_up = hidden_states[tokens] @ gemm1_weights[e].T
        act = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
        output.index_add_(0, tokens, (act @ gemm2_weights[e].T).float() * weights[tokens, slots, None])
    shared_weights = shared_gate_logits.float().sigmoid()
    routed = routing_logits.shape[-1]
    for s in range(shared_gate_logits.shape[-1]):
        gate_up = hidden_states @ gemm1_weights[routed + s].T
        act = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
        output += (act @ gemm2_weights[routed + s].T).float() * shared_weights[:, s, None]
    return output.to(hidden_states.dtype)
