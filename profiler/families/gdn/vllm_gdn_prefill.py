"""vLLM's Triton ``chunk_gated_delta_rule`` (its copy of flash-linear-attention's chunked prefill),
as the engine runs a step's prefill requests over their ``cu_seqlens``: the gates computed first, as
vLLM's gating kernel gives them (the log decay ``g = -exp(A_log) softplus(a + dt_bias)`` in float32,
``beta = sigmoid(b)``), from the requests' states. Query and key are unit vectors already."""

import torch
import torch.nn.functional as F

try:  # vLLM 0.3x
    from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule
except ImportError:  # vLLM 0.2x
    from vllm.model_executor.layers.fla.ops import chunk_gated_delta_rule


def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float()).to(b.dtype)
    output, new_state = chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], scale=float(scale) if scale else None,
        initial_state=state.contiguous(), output_final_state=True, cu_seqlens=cu_seqlens.to(torch.int32),
        use_qk_l2norm_in_kernel=False)
    return output[0], new_state
