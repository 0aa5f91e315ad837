"""Gated DeltaNet prefill over sequences of several lengths (``cu_seqlens``), in PyTorch: the
recurrence token by token, every sequence and value head at once at each position.

Gates: g = exp(-exp(A_log) * softplus(a + dt_bias)) (the decay), beta = sigmoid(b) (the update).
With the state S of a head as [V, K] (k-last), its delta rule over a token is
    S <- g S;  old = S k;  new = beta v + (1 - beta) old;  S <- S + (new - old) k^T;  o = scale S q
in fp32, each output rounded to bf16 once. A sequence starts from its ``state`` (zero where there
is none); its ``new_state`` is the state after its last token (zero for a sequence of no tokens,
as the reference leaves it).
"""

import math

import torch
import torch.nn.functional as F

OUTPUTS = ("output", "new_state")


@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    total, num_q_heads, head_k = q.shape
    num_k_heads, num_v_heads, head_v = k.shape[1], v.shape[1], v.shape[2]
    num_seqs = cu_seqlens.numel() - 1
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_k)
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))  # [T, HV]
    beta = torch.sigmoid(b.float()).unsqueeze(-1)  # [T, HV, 1]
    q_heads = q.float().repeat_interleave(num_v_heads // num_q_heads, dim=1)  # [T, HV, K]
    k_heads = k.float().repeat_interleave(num_v_heads // num_k_heads, dim=1)
    values = v.float()
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens[1:].long() - starts
    states = (torch.zeros(num_seqs, num_v_heads, head_v, head_k, dtype=torch.float32, device=q.device)
              if state is None else state.float().clone())
    states[lengths <= 0] = 0.0
    output = torch.zeros(total, num_v_heads, head_v, dtype=torch.float32, device=q.device)
    for position in range(int(lengths.max()) if num_seqs else 0):
        active = torch.nonzero(lengths > position).squeeze(1)  # the sequences with a token here
        tokens = starts[active] + position
        decayed = states[active] * g[tokens][:, :, None, None]  # [n, HV, V, K]
        keys = k_heads[tokens]
        old = torch.einsum("nhvk,nhk->nhv", decayed, keys)
        new = beta[tokens] * values[tokens] + (1 - beta[tokens]) * old
        updated = decayed + (new - old).unsqueeze(-1) * keys.unsqueeze(-2)
        states[active] = updated
        output[tokens] = scale * torch.einsum("nhvk,nhk->nhv", updated, q_heads[tokens])
    return output.to(torch.bfloat16), states
