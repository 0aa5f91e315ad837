"""The cos/sin cache the engines' RoPE kernels read, over a Llama-3.1-long context, from the
``rope`` family's inverse frequencies (its constants set for the Definition). A sibling source of
the native RoPE baselines (``rope.py`` beside it in the same Solution)."""

import torch
from rope import _inv_freq

MAX_POSITION = 131072
_COS_SIN = {}


def cos_sin_cache(head_dim, device, dtype):
    key = (head_dim, device, dtype)
    if key not in _COS_SIN:
        t = torch.arange(MAX_POSITION, device=device, dtype=torch.float32)
        freqs = torch.outer(t, _inv_freq(head_dim, device))
        _COS_SIN[key] = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)
    return _COS_SIN[key]
