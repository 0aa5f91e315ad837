import torch

top_k = 4
RENORMALIZE = True
ALPHA = 1.702
LIMIT = 7.0


def run(hidden_states, routing_logits, gemm1_weights, gemm1_bias, gemm2_weights, gemm2_bias):
    """Route, then one pass per expert that got tokens: gathered GEMMs with their biases in the input
    dtype, gpt-oss's SwiGLU on the interleaved gate and up rows."""
    weights, experts = routing_logits.float().softmax(-1).topk(top_k, dim=-1)
    if RENORMALIZE:
        weights = weights / weights.sum(-1, keepdim=True)
    output = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for e in experts.unique().tolist():
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        gate_up = torch.addmm(gemm1_bias[e], hidden_states[tokens], gemm1_weights[e].T).float()
        gate, up = gate_up[:, 0::2].clamp(max=LIMIT), gate_up[:, 1::2].clamp(-LIMIT, LIMIT)
        act = (gate * torch.sigmoid(ALPHA * gate) * (up + 1)).to(hidden_states.dtype)
        out = torch.addmm(gemm2_bias[e], act, gemm2_weights[e].T).float() * weights[tokens, slots, None]
        output.index_add_(0, tokens, out)
    return output.to(hidden_states.dtype)
