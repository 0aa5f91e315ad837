"""Gated DeltaNet decode, one token per sequence, in PyTorch: every sequence and value head at once.

Gates: g = exp(-exp(A_log) * softplus(a + dt_bias)) (the decay), beta = sigmoid(b) (the update).
With the state S of a head as [V, K] (k-last), its delta rule over one token is
    S <- g S;  old = S k;  new = beta v + (1 - beta) old;  S <- S + (new - old) k^T;  o = scale S q
in fp32, the output rounded to bf16 once. Query and key heads are shared by groups of value heads.
"""

import math

import torch
import torch.nn.functional as F

OUTPUTS = ("output", "new_state")


@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    batch, _, num_q_heads, head_k = q.shape
    num_k_heads, num_v_heads, head_v = k.shape[2], v.shape[2], v.shape[3]
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_k)
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a[:, 0].float() + dt_bias.float()))  # [B, HV]
    beta = torch.sigmoid(b[:, 0].float()).unsqueeze(-1)  # [B, HV, 1]
    q_heads = q[:, 0].float().repeat_interleave(num_v_heads // num_q_heads, dim=1)  # [B, HV, K]
    k_heads = k[:, 0].float().repeat_interleave(num_v_heads // num_k_heads, dim=1)
    if state is None:
        state = torch.zeros(batch, num_v_heads, head_v, head_k, dtype=torch.float32, device=q.device)
    decayed = state.float() * g[:, :, None, None]  # [B, HV, V, K]
    old = torch.einsum("bhvk,bhk->bhv", decayed, k_heads)
    new = beta * v[:, 0].float() + (1 - beta) * old
    new_state = decayed + (new - old).unsqueeze(-1) * k_heads.unsqueeze(-2)
    output = scale * torch.einsum("bhvk,bhk->bhv", new_state, q_heads)
    return output.unsqueeze(1).to(torch.bfloat16), new_state
