import torch

ROPE_THETA = 10000.0
LINEAR_FACTOR = 1.0  # positions are divided by it (rope_type "linear")

_INV_FREQ = {}


def _inv_freq(head_dim, device):
    """The inverse frequencies with the linear factor folded in: position / f × freq = position ×
    (freq / f) (so the engines' cos/sin cache, built from them, is the linear RoPE's too)."""
    key = (head_dim, device)
    if key not in _INV_FREQ:
        freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        _INV_FREQ[key] = (freq / LINEAR_FACTOR).to(torch.float32).to(device)
    return _INV_FREQ[key]


def run(q, k, positions):
    angles = positions.to(torch.float32)[:, None] * _inv_freq(q.shape[-1], q.device)[None, :]
    cos, sin = torch.cos(angles)[:, None, :], torch.sin(angles)[:, None, :]

    def rotate(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)
