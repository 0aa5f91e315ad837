"""Mamba-2's selective state update in PyTorch: every one-token request at once (its slot's state
gathered, updated in float32, scattered back)."""

import torch
import torch.nn.functional as F

OUTPUTS = ("output", "new_state")


@torch.no_grad()
def run(state, x, dt, A, B, C, D, dt_bias, state_batch_indices):
    ratio = x.shape[1] // B.shape[1]
    slots = state_batch_indices.long()
    live = slots >= 0
    step = F.softplus(dt.float() + dt_bias.float())  # [N, H, D]
    s = state[slots.clamp_min(0)].float()  # [N, H, D, S]
    B_heads = B.float().repeat_interleave(ratio, dim=1).unsqueeze(-2)  # [N, H, 1, S]
    C_heads = C.float().repeat_interleave(ratio, dim=1).unsqueeze(-2)
    s = s * torch.exp(A.float() * step.unsqueeze(-1)) + (step * x.float()).unsqueeze(-1) * B_heads
    output = ((s * C_heads).sum(-1) + x.float() * D.float()) * live.view(-1, 1, 1)
    new_state = state.clone()
    new_state[slots[live]] = s[live].to(state.dtype)
    return output.to(x.dtype), new_state
