import torch
import torch.nn.functional as F

top_k = 2
RENORMALIZE = True


def run(hidden_states, routing_logits, gemm1_weights, gemm2_weights):
    """Route, then one pass per expert that got tokens: gathered GEMMs in the input dtype."""
    weights, experts = routing_logits.float().softmax(-1).topk(top_k, dim=-1)
    if RENORMALIZE:
        weights = weights / weights.sum(-1, keepdim=True)
    output = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    intermediate = gemm2_weights.shape[-1]
    for e in experts.unique().tolist():
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        gate_up = hidden_states[tokens] @ gemm1_weights[e].T
        act = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
        out = (act @ gemm2_weights[e].T).float() * weights[tokens, slots, None]
        output.index_add_(0, tokens, out)
    return output.to(hidden_states.dtype)
