import torch
import torch.nn.functional as F

TOP_K = 8
BLOCK = 128


def _dequantize(q, scale):
    """FP8 data times its (BLOCK x BLOCK) block scales, in bfloat16."""
    s = scale.float().repeat_interleave(BLOCK, -2).repeat_interleave(BLOCK, -1)
    return (q.float() * s[..., : q.shape[-2], : q.shape[-1]]).to(torch.bfloat16)


def run(routing_logits, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
        gemm2_weights_scale):
    """Softmax top-k routing renormalized, then each expert that got tokens as bfloat16 GEMMs on its
    dequantized weights ([up; gate])."""
    T, H = hidden_states.shape
    x = (hidden_states.float() * hidden_states_scale.float().T.repeat_interleave(BLOCK, 1)[:, :H]).to(torch.bfloat16)
    weights, experts = routing_logits.float().softmax(dim=-1).topk(TOP_K, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    output = torch.zeros((T, H), dtype=torch.float32, device=hidden_states.device)
    intermediate = gemm2_weights.shape[-1]
    for e in experts.unique().tolist():
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        up_gate = x[tokens] @ _dequantize(gemm1_weights[e], gemm1_weights_scale[e]).T
        act = F.silu(up_gate[:, intermediate:]) * up_gate[:, :intermediate]
        out = act @ _dequantize(gemm2_weights[e], gemm2_weights_scale[e]).T
        output.index_add_(0, tokens, out.float() * weights[tokens, slots, None])
    return output.to(torch.bfloat16)
