"""SGLang's Triton packed decode (``fused_recurrent_gated_delta_rule_packed_decode``, its copy of
flash-linear-attention's recurrence with the gates fused in), as its ``GDNAttnBackend`` runs a step's
decode requests on CUDA: query, key and value packed per token as the conv1d leaves them (packed
here, a copy inside the call: the engine's kernel reads the conv1d's output as it is), the query and
key normalized in the kernel (unit vectors already: the same up to rounding), each request's state
updated in place in its slot (request i in slot i)."""

import torch
from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_packed_decode


def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    batch, _, heads, head_k = q.shape
    v_heads, head_v = v.shape[2], v.shape[3]
    mixed = torch.cat([q.reshape(batch, -1), k.reshape(batch, -1), v.reshape(batch, -1)], dim=1)
    output = v.new_empty(batch, 1, v_heads, head_v)
    fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=mixed, a=a.reshape(batch, v_heads), b=b.reshape(batch, v_heads), A_log=A_log, dt_bias=dt_bias,
        scale=float(scale) if scale else head_k ** -0.5, initial_state=state, out=output,
        ssm_state_indices=torch.arange(batch, dtype=torch.int32, device=q.device), use_qk_l2norm_in_kernel=True)
    return output
