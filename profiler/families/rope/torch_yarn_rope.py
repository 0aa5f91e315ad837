import math

import torch

ROPE_THETA = 10000.0
FACTOR = 40.0
ORIGINAL_MAX_POSITION = 4096
BETA_FAST = 32.0
BETA_SLOW = 1.0
MSCALE = 1.0
EXTRAPOLATION_FACTOR = 1.0
#: the ramp's ends rounded to whole dimensions (DeepSeek's, and YaRN's default; gpt-oss's is not)
TRUNCATE = True
#: what the engines' kernels are told (rope_cos_sin.py): interleaved pairs (DeepSeek's) or NeoX
#: style (the generic YaRN of Qwen and gpt-oss), over a cache of the scaled context
NEOX_STYLE = False
MAX_POSITION = int(ORIGINAL_MAX_POSITION * FACTOR)

_INV_FREQ = {}


def _inv_freq(head_dim, device):
    key = (head_dim, device)
    if key not in _INV_FREQ:
        def correction_dim(rotations):
            return head_dim * math.log(ORIGINAL_MAX_POSITION / (rotations * 2 * math.pi)) / (2 * math.log(ROPE_THETA))

        pos_freqs = ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        low, high = correction_dim(BETA_FAST), correction_dim(BETA_SLOW)
        if TRUNCATE:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        high = high + 0.001 if low == high else high
        keep = (1 - torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1))
        keep = keep * EXTRAPOLATION_FACTOR
        _INV_FREQ[key] = (1.0 / (FACTOR * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep).to(device)
    return _INV_FREQ[key]


def run(q, k, positions):
    angles = positions.to(torch.float32)[:, None] * _inv_freq(q.shape[-1], q.device)[None, :]
    cos, sin = (torch.cos(angles) * MSCALE)[:, None, :], (torch.sin(angles) * MSCALE)[:, None, :]

    def rotate(x):
        if NEOX_STYLE:
            x1, x2 = x.float().chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        pairs = x.float().unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2).to(x.dtype)

    return rotate(q), rotate(k)
