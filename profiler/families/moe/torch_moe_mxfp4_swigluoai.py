import torch

top_k = 4
RENORMALIZE = True
ALPHA = 1.702
LIMIT = 7.0

#: the E2M1 values of the 16 four-bit codes (sign bit 3)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize(packed, scales, dtype):
    """One expert's MXFP4 weights in ``dtype`` (exact: E2M1 times a power of two): the codes two a
    byte, the lower nibble first; blocks of 32 along the input times 2^(s - 127)."""
    codes = packed.view(torch.uint8)
    table = torch.tensor(E2M1, dtype=dtype, device=codes.device)
    values = torch.stack([table[(codes & 0xF).long()], table[(codes >> 4).long()]], dim=-1).flatten(-2)
    scale = torch.exp2(scales.view(torch.uint8).float() - 127).to(dtype)
    return (values.unflatten(-1, (-1, 32)) * scale.unsqueeze(-1)).flatten(-2)


def run(hidden_states, routing_logits, gemm1_weights, gemm1_scales, gemm1_bias, gemm2_weights, gemm2_scales,
        gemm2_bias):
    """Route, then one pass per expert that got tokens: its weights dequantized to the input dtype,
    gathered GEMMs with their biases, gpt-oss's SwiGLU on the interleaved gate and up rows."""
    weights, experts = routing_logits.float().softmax(-1).topk(top_k, dim=-1)
    if RENORMALIZE:
        weights = weights / weights.sum(-1, keepdim=True)
    dtype = hidden_states.dtype
    output = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for e in experts.unique().tolist():
        tokens, slots = (experts == e).nonzero(as_tuple=True)
        w1 = dequantize(gemm1_weights[e], gemm1_scales[e], dtype)
        gate_up = torch.addmm(gemm1_bias[e], hidden_states[tokens], w1.T).float()
        gate, up = gate_up[:, 0::2].clamp(max=LIMIT), gate_up[:, 1::2].clamp(-LIMIT, LIMIT)
        act = (gate * torch.sigmoid(ALPHA * gate) * (up + 1)).to(dtype)
        w2 = dequantize(gemm2_weights[e], gemm2_scales[e], dtype)
        out = torch.addmm(gemm2_bias[e], act, w2.T).float() * weights[tokens, slots, None]
        output.index_add_(0, tokens, out)
    return output.to(dtype)
