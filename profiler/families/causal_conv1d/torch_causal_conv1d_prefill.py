"""Causal depthwise conv1d (a bias where the Definition has one) with SiLU over sequences of
several lengths (``cu_seqlens``), in PyTorch: per sequence, its slot's state (or zeros) then its
tokens through ``F.conv1d`` with one group per channel."""

import torch
import torch.nn.functional as F

OUTPUTS = ("output", "new_conv_state")


@torch.no_grad()
def run(x, conv_state, weight, cu_seqlens, conv_state_indices, has_initial_state, bias=None):
    channels, width = weight.shape
    state_len = width - 1
    filters = weight.float().unsqueeze(1)  # [C, 1, W]
    shift = None if bias is None else bias.float()
    output = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    new_conv_state = conv_state.clone()
    bounds = cu_seqlens.tolist()
    slots = conv_state_indices.tolist()
    initial = has_initial_state.tolist()
    for i, slot in enumerate(slots):
        start, end = bounds[i], bounds[i + 1]
        if end <= start or slot < 0:
            continue
        before = (conv_state[slot].float() if initial[i]
                  else torch.zeros(channels, state_len, dtype=torch.float32, device=x.device))
        inputs = torch.cat([before, x[start:end].float().t()], dim=1)  # [C, state_len + L]
        output[start:end] = F.silu(F.conv1d(inputs.unsqueeze(0), filters, shift, groups=channels)[0]).t().to(x.dtype)
        new_conv_state[slot] = inputs[:, -state_len:].to(conv_state.dtype)
    return output, new_conv_state
