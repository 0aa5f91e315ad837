import flashinfer
import torch
from rope_cos_sin import NEOX_STYLE, cos_sin_cache


def run(q, k, positions):
    """FlashInfer's RoPE from a float32 cos/sin cache (vLLM/SGLang compatible), NeoX style or interleaved."""
    n, _, head_dim = q.shape
    q_out, k_out = flashinfer.rope.apply_rope_with_cos_sin_cache(
        positions, q.reshape(n, -1), k.reshape(n, -1), head_dim, cos_sin_cache(head_dim, q.device, torch.float32), NEOX_STYLE
    )
    return q_out.view(q.shape), k_out.view(k.shape)
