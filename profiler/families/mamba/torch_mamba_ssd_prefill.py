"""Mamba-2's selective state space scan over sequences of several lengths in PyTorch: all the
sequences' positions at once, one position after another (the state of every sequence updated by
a masked step), in float32."""

import torch
import torch.nn.functional as F

OUTPUTS = ("output", "new_state")


@torch.no_grad()
def run(x, dt, A, B, C, D, dt_bias, cu_seqlens, state, state_indices, has_initial_state):
    nheads, ngroups = x.shape[1], B.shape[1]
    ratio = nheads // ngroups
    bounds = cu_seqlens.long()
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
    slots = state_indices.long()
    live = (slots >= 0) & (lengths > 0)
    step = F.softplus(dt.float() + dt_bias.float())  # [T, H]
    decay = torch.exp(A.float() * step)
    B_heads = B.float().repeat_interleave(ratio, dim=1)  # [T, H, S]
    C_heads = C.float().repeat_interleave(ratio, dim=1)
    s = state[slots.clamp_min(0)].float() * (has_initial_state & live).view(-1, 1, 1, 1)  # [N, H, D, S]
    output = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(int(lengths.max()) if lengths.numel() else 0):
        going = live & (t < lengths)
        rows = (starts + t).clamp_max(x.shape[0] - 1)  # each sequence's t-th token (a finished one's is masked)
        xt = x[rows].float()
        updated = (s * decay[rows][:, :, None, None]
                   + (step[rows][:, :, None] * xt)[..., None] * B_heads[rows][:, :, None, :])
        s = torch.where(going.view(-1, 1, 1, 1), updated, s)
        y = (s * C_heads[rows][:, :, None, :]).sum(-1) + D.float()[:, None] * xt
        output[rows[going]] = y[going]
    new_state = state.clone()
    new_state[slots[live]] = s[live].to(state.dtype)
    return output.to(x.dtype), new_state
