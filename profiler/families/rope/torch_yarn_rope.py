import math

import torch

ROPE_THETA = 10000.0
FACTOR = 40.0
ORIGINAL_MAX_POSITION = 4096
BETA_FAST = 32.0
BETA_SLOW = 1.0
MSCALE = 1.0
EXTRAPOLATION_FACTOR = 1.0
#: what the engines' kernels are told (rope_cos_sin.py): interleaved pairs, a cache over the scaled context
NEOX_STYLE = False
MAX_POSITION = int(ORIGINAL_MAX_POSITION * FACTOR)

_INV_FREQ = {}


def _inv_freq(head_dim, device):
    key = (head_dim, device)
    if key not in _INV_FREQ:
        def correction_dim(rotations):
            return head_dim * math.log(ORIGINAL_MAX_POSITION / (rotations * 2 * math.pi)) / (2 * math.log(ROPE_THETA))

        pos_freqs = ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        low = max(math.floor(correction_dim(BETA_FAST)), 0)
        high = min(math.ceil(correction_dim(BETA_SLOW)), head_dim - 1)
        high = high + 0.001 if low == high else high
        keep = (1 - torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1))
        keep = keep * EXTRAPOLATION_FACTOR
        _INV_FREQ[key] = (1.0 / (FACTOR * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep).to(device)
    return _INV_FREQ[key]


def run(q, k, positions):
    angles = positions.to(torch.float32)[:, None] * _inv_freq(q.shape[-1], q.device)[None, :]
    cos, sin = (torch.cos(angles) * MSCALE)[:, None, :], (torch.sin(angles) * MSCALE)[:, None, :]

    def rotate(x):
        pairs = x.float().unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2).to(x.dtype)

    return rotate(q), rotate(k)
