"""vLLM's Triton ``fused_sigmoid_gating_delta_rule_update`` (its copy of flash-linear-attention's
recurrence with the gates fused in), as the engine runs a step's decode requests, one token each,
over ``cu_seqlens``: here from the requests' own states (``initial_state`` indexed by sequence, no
slot indices) into a new state per token, which for one token each is the request's new state. Query
and key are unit vectors already (``use_qk_l2norm_in_kernel`` off: the engine's kernel normalizes
them itself, as the Definition's inputs are)."""

import torch

try:  # vLLM 0.3x
    from vllm.third_party.flash_linear_attention.ops import fused_sigmoid_gating_delta_rule_update
except ImportError:  # vLLM 0.2x
    from vllm.model_executor.layers.fla.ops import fused_sigmoid_gating_delta_rule_update


def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    batch, _, heads, head_k = q.shape
    v_heads, head_v = v.shape[2], v.shape[3]
    starts = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    output, new_state = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a.reshape(batch, v_heads), b=b.reshape(batch, v_heads), dt_bias=dt_bias,
        q=q.reshape(1, batch, heads, head_k), k=k.reshape(1, batch, k.shape[2], head_k),
        v=v.reshape(1, batch, v_heads, head_v), scale=float(scale) if scale else None,
        initial_state=state.contiguous(), inplace_final_state=False, cu_seqlens=starts,
        use_qk_l2norm_in_kernel=False)
    return output.reshape(batch, 1, v_heads, head_v), new_state
