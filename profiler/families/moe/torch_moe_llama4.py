import torch
import torch.nn.functional as F

top_k = 1
WEIGHT_ON_INPUT = True


def run(hidden_states, routing_logits, gemm1_weights, gemm2_weights):
    """Llama-4's routing (the top-k logits through a sigmoid), the weight on each expert's input,
    then one pass per expert that got tokens: gathered GEMMs in the input dtype."""
    logits, experts = routing_logits.float().topk(top_k, dim=-1)
    weights = logits.sigmoid()
    output = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    intermediate = gemm2_weights.shape[-1]
    for e in experts.unique().tolist():
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        x = (hidden_states[tokens] * weights[tokens, slots, None]).to(hidden_states.dtype)
        gate_up = x @ gemm1_weights[e].T
        act = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
        output.index_add_(0, tokens, (act @ gemm2_weights[e].T).float())
    return output.to(hidden_states.dtype)
