"""Causal depthwise conv1d (a bias where the Definition has one) with SiLU, one token per sequence
against a paged conv-state cache, in PyTorch: every sequence at once (the window is the slot's last
inputs then the token)."""

import torch
import torch.nn.functional as F

OUTPUTS = ("output", "new_conv_state")


@torch.no_grad()
def run(x, conv_state, weight, conv_state_indices, bias=None):
    slots = conv_state_indices.long()
    live = slots >= 0
    chosen = slots.clamp_min(0)
    window = torch.cat([conv_state[chosen].float(), x.float().unsqueeze(-1)], dim=-1)  # [B, C, W]
    summed = (window * weight.float()).sum(dim=-1)
    if bias is not None:
        summed = summed + bias.float()
    output = F.silu(summed) * live.unsqueeze(-1)
    new_conv_state = conv_state.clone()
    new_conv_state[slots[live]] = window[live, :, 1:].to(conv_state.dtype)
    return output.to(x.dtype), new_conv_state
