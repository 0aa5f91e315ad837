import math

import torch

ROPE_THETA = 10000.0
FACTOR = 1.0
LOW_FREQ_FACTOR = 1.0
HIGH_FREQ_FACTOR = 4.0
ORIGINAL_MAX_POSITION = 8192
#: the first head dimensions rotated (partial rotary), the rest passed through; None: the whole head
ROTARY_DIM = None

_INV_FREQ = {}


def _inv_freq(head_dim, device):
    key = (head_dim, device)
    if key not in _INV_FREQ:
        freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        if FACTOR != 1.0:
            wavelen = 2 * math.pi / freq
            smooth = (ORIGINAL_MAX_POSITION / wavelen - LOW_FREQ_FACTOR) / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR)
            blended = (1 - smooth) * freq / FACTOR + smooth * freq
            freq = torch.where(
                wavelen < ORIGINAL_MAX_POSITION / HIGH_FREQ_FACTOR,
                freq,
                torch.where(wavelen > ORIGINAL_MAX_POSITION / LOW_FREQ_FACTOR, freq / FACTOR, blended),
            )
        _INV_FREQ[key] = freq.to(torch.float32).to(device)
    return _INV_FREQ[key]


def run(q, k, positions):
    rotary = ROTARY_DIM or q.shape[-1]
    angles = positions.to(torch.float32)[:, None] * _inv_freq(rotary, q.device)[None, :]
    cos, sin = torch.cos(angles)[:, None, :], torch.sin(angles)[:, None, :]

    def rotate(x):
        x1, x2 = x[..., :rotary].float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rotary:].float()], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)
