import torch
import torch.nn.functional as F

top_k = 8
N_GROUP = 8
TOPK_GROUP = 4
RENORMALIZE = True
ROUTED_SCALING_FACTOR = 2.5


def run(hidden_states, routing_logits, routing_bias, gemm1_weights, gemm2_weights, local_expert_offset=0):
    """DeepSeek routing (sigmoid, bias-chosen grouped top-k), then one pass per expert that got tokens;
    the experts whose weights follow the routed ones are shared ones fused in: every token, weight 1.
    Under expert parallelism the weights are the rank's experts from ``local_expert_offset`` on, and
    the output is their part of the sum."""
    scores = routing_logits.float().sigmoid()
    biased = scores + routing_bias.float()
    groups = biased.unflatten(-1, (N_GROUP, -1))
    kept = groups.topk(2, dim=-1).values.sum(-1).topk(TOPK_GROUP, dim=-1).indices
    mask = torch.zeros(groups.shape[:-1], dtype=torch.bool, device=groups.device).scatter_(1, kept, True)
    experts = biased.masked_fill(~mask.repeat_interleave(groups.shape[-1], dim=1), float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if RENORMALIZE:
        weights = weights / weights.sum(-1, keepdim=True)
    weights = weights * ROUTED_SCALING_FACTOR
    output = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    intermediate = gemm2_weights.shape[-1]
    routed, first = routing_logits.shape[-1], int(local_expert_offset)
    local = min(gemm1_weights.shape[0], routed)  # the routed experts whose weights are here
    for e in experts.unique().tolist():
        if not first <= e < first + local:
            continue
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        gate_up = hidden_states[tokens] @ gemm1_weights[e - first].T
        act = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
        out = (act @ gemm2_weights[e - first].T).float() * weights[tokens, slots, None]
        output.index_add_(0, tokens, out)
    for e in range(routed, gemm1_weights.shape[0]):
        gate_up = hidden_states @ gemm1_weights[e].T
        output += (F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]) @ gemm2_weights[e].T
    return output.to(hidden_states.dtype)
