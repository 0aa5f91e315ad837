import vllm._custom_ops  # registers torch.ops._C


def run(q, k, positions):
    """vLLM's rotary_embedding kernel (in place, on copies; the cache in the model dtype, as vLLM keeps it)."""
    n, _, head_dim = q.shape
    q_out, k_out = q.reshape(n, -1).clone(), k.reshape(n, -1).clone()
    torch.ops._C.rotary_embedding(positions, q_out, k_out, head_dim, _cos_sin(head_dim, q.device, q.dtype), True)
    return q_out.view(q.shape), k_out.view(k.shape)
