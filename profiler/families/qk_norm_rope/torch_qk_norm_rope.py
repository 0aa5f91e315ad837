import torch
import torch.nn.functional as F

EPS = 1e-6
OUTPUTS = ("q_out", "k_out", "gate_out")


def run(q_gate, k, q_weight, k_weight, cos_sin_cache, positions):
    """Split, F.rms_norm per head (rounded to the activations' dtype, as the engines' kernel
    rounds it), NeoX-style rotation of the first rotary_dim dimensions."""
    head_size = k.shape[-1]
    q, gate = q_gate.split(head_size, dim=-1)
    rotary_dim = cos_sin_cache.shape[-1]
    half = rotary_dim // 2
    cos_sin = cos_sin_cache.index_select(0, positions).float()
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]

    def norm_rope(x, weight):
        x = F.rms_norm(x.float(), (head_size,), weight.float(), eps=EPS).to(x.dtype)
        x1, x2 = x[..., :half].float(), x[..., half:rotary_dim].float()
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)

    return norm_rope(q, q_weight), norm_rope(k, k_weight), gate.contiguous()
