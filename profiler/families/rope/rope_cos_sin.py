"""The cos/sin cache the engines' RoPE kernels read, from the ``rope`` family's inverse frequencies
(its constants set for the Definition), scaled by its magnitude (DeepSeek's YaRN ``MSCALE``), over
its context (``MAX_POSITION``: YaRN's original context times its factor, as the engines size it;
else Llama-3.1's); and whether its pairs are NeoX style. A sibling source of the native RoPE
baselines (``rope.py`` beside it in the same Solution)."""

import rope
import torch
from rope import _inv_freq

MAX_POSITION = int(getattr(rope, "MAX_POSITION", 131072))
MSCALE = float(getattr(rope, "MSCALE", 1.0))
NEOX_STYLE = bool(getattr(rope, "NEOX_STYLE", True))
#: the first head dimensions rotated (partial rotary: the cache is [positions, ROTARY_DIM]); None: all
ROTARY_DIM = getattr(rope, "ROTARY_DIM", None)
_COS_SIN = {}


def cos_sin_cache(head_dim, device, dtype):
    rotary = ROTARY_DIM or head_dim
    key = (rotary, device, dtype)
    if key not in _COS_SIN:
        t = torch.arange(MAX_POSITION, device=device, dtype=torch.float32)
        freqs = torch.outer(t, _inv_freq(rotary, device))
        _COS_SIN[key] = torch.cat([freqs.cos() * MSCALE, freqs.sin() * MSCALE], dim=-1).to(dtype)
    return _COS_SIN[key]
