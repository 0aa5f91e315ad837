import torch
import torch.nn.functional as F

TOP_K = 8
N_GROUP = 8
TOPK_GROUP = 4
BLOCK = 128


def _dequantize(q, scale):
    """FP8 data times its (BLOCK x BLOCK) block scales, in bfloat16."""
    s = scale.float().repeat_interleave(BLOCK, -2).repeat_interleave(BLOCK, -1)
    return (q.float() * s[..., : q.shape[-2], : q.shape[-1]]).to(torch.bfloat16)


def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    """DeepSeek routing, then each local expert that got tokens as bfloat16 GEMMs on its dequantized
    weights ([up; gate]); fused shared experts (weights beyond the routed ones) for every token."""
    T, H = hidden_states.shape
    x = (hidden_states.float() * hidden_states_scale.float().T.repeat_interleave(BLOCK, 1)[:, :H]).to(torch.bfloat16)
    scores = routing_logits.float().sigmoid()
    biased = scores + routing_bias.float()
    groups = biased.unflatten(-1, (N_GROUP, -1))
    kept = groups.topk(2, dim=-1).values.sum(-1).topk(TOPK_GROUP, dim=-1).indices
    mask = torch.zeros(groups.shape[:-1], dtype=torch.bool, device=groups.device).scatter_(1, kept, True)
    experts = biased.masked_fill(~mask.repeat_interleave(groups.shape[-1], dim=1), float("-inf")).topk(TOP_K, dim=-1).indices
    weights = scores.gather(1, experts)
    weights = weights / weights.sum(-1, keepdim=True) * routed_scaling_factor
    output = torch.zeros((T, H), dtype=torch.float32, device=hidden_states.device)
    intermediate = gemm2_weights.shape[-1]
    first = int(local_expert_offset)
    local = min(gemm1_weights.shape[0], routing_logits.shape[-1])
    for e in experts.unique().tolist():
        if not first <= e < first + local:
            continue
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        up_gate = x[tokens] @ _dequantize(gemm1_weights[e - first], gemm1_weights_scale[e - first]).T
        act = F.silu(up_gate[:, intermediate:]) * up_gate[:, :intermediate]
        out = act @ _dequantize(gemm2_weights[e - first], gemm2_weights_scale[e - first]).T
        output.index_add_(0, tokens, out.float() * weights[tokens, slots, None])
    for e in range(local, gemm1_weights.shape[0]):
        up_gate = x @ _dequantize(gemm1_weights[e], gemm1_weights_scale[e]).T
        act = F.silu(up_gate[:, intermediate:]) * up_gate[:, :intermediate]
        output += (act @ _dequantize(gemm2_weights[e], gemm2_weights_scale[e]).T).float()
    return output.to(torch.bfloat16)
