import torch
import vllm._custom_ops  # noqa: F401  registers torch.ops._C
from rope_cos_sin import NEOX_STYLE, cos_sin_cache


def run(q, k, positions):
    """vLLM's rotary_embedding kernel (in place, on copies; the cache in the model dtype, as vLLM keeps it)."""
    n, _, head_dim = q.shape
    q_out, k_out = q.reshape(n, -1).clone(), k.reshape(n, -1).clone()
    torch.ops._C.rotary_embedding(positions, q_out, k_out, head_dim, cos_sin_cache(head_dim, q.device, q.dtype), NEOX_STYLE)
    return q_out.view(q.shape), k_out.view(k.shape)
