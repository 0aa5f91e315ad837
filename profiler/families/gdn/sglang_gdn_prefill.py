"""SGLang's Triton chunked prefill (``chunk_gated_delta_rule``, its copy of flash-linear-attention's),
as its ``GDNAttnBackend`` runs a step's prefill requests over their ``cu_seqlens`` on CUDA: its
gating kernel first (``fused_gdn_gating``: the log decay ``-exp(A_log) softplus(a + dt_bias)`` and
``sigmoid(b)``, in float32), the query and key normalized in the kernel (unit vectors already: the
same up to rounding), each request's state read from and written back to its slot in place
(request i in slot i)."""

import torch
from sglang.kernels.ops.attention.fla.chunk import chunk_gated_delta_rule
from sglang.kernels.ops.attention.fla.fused_gdn_gating import fused_gdn_gating


def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    g, beta = fused_gdn_gating(A_log, a, b, dt_bias)
    output, _, _ = chunk_gated_delta_rule(
        q[None], k[None], v[None], g, beta, scale=float(scale) if scale else None, initial_state=state,
        initial_state_indices=torch.arange(state.shape[0], dtype=torch.int32, device=q.device),
        cu_seqlens=cu_seqlens.to(torch.int64), head_first=False, use_qk_l2norm_in_kernel=True)
    return output[0]
