# Test scaffolding for SGLang on CPU: sgl_kernel.mamba in PyTorch (no CPU build of sgl-kernel is on
# PyPI). SGLang 0.5.23's Gated DeltaNet backend imports these on CPU, and looks up
# torch.ops.sgl_kernel.{fused_gdn_gating,fused_sigmoid_gating_delta_rule_update,fused_rmsnorm_gated}_cpu
# (the last: cpu_paths.py); they are set here. They follow the recurrences as SGLang's Triton kernels compute them (states per
# slot: conv [dim, width - 1], recurrent [value heads, V, K] in float32), slowly; a form SGLang may
# call that is not written here (speculative decoding's windows) raises.
#
# Mamba-2's mixer (Nemotron-H) binds no conv1d on CPU and launches Triton for its scan and state
# update: cpu_paths.py binds the conv1d above and the two recurrences below in its module, written as
# the state space recurrence (a float32 state [heads, head size, state size] per slot).
import torch
import torch.nn.functional as F

__all__ = ["causal_conv1d_fn_cpu", "causal_conv1d_update_cpu", "chunk_gated_delta_rule_cpu",
           "mamba_chunk_scan_combined_cpu", "selective_state_update_cpu"]


def _activate(x, activation):
    if activation in (None, False):
        return x
    if activation in ("silu", "swish", True):
        return F.silu(x)
    raise NotImplementedError(f"sgl_kernel.mamba test scaffolding: activation {activation!r}")


def causal_conv1d_fn_cpu(x, weight, bias=None, activation=None, conv_states=None, has_initial_state=None,
                         cache_indices=None, query_start_loc=None, seq_lens_cpu=None, **unsupported):
    """x [dim, tokens] of the step's sequences by ``query_start_loc``; each one's conv state, where
    it has one, is its left context, and its last width - 1 inputs become its slot's state."""
    if any(value is not None for value in unsupported.values()):
        raise NotImplementedError(f"sgl_kernel.mamba test scaffolding: causal_conv1d_fn with {sorted(unsupported)}")
    width = weight.shape[-1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    for i in range(len(starts) - 1):
        seq = x[:, starts[i]:starts[i + 1]].float()
        slot = int(cache_indices[i])
        left = conv_states[slot].float() if has_initial_state is not None and bool(has_initial_state[i]) \
            else seq.new_zeros(x.shape[0], width - 1)
        full = torch.cat([left, seq], dim=1)
        y = F.conv1d(full[None], weight.float()[:, None, :], None if bias is None else bias.float(),
                     groups=x.shape[0])[0]
        out[:, starts[i]:starts[i + 1]] = _activate(y, activation).to(x.dtype)
        conv_states[slot] = full[:, -(width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                             **unsupported):
    """One new input per sequence (x [batch, dim]) against its slot's conv state, shifted in place."""
    if x.dim() != 2 or any(value is not None for value in unsupported.values()):
        raise NotImplementedError("sgl_kernel.mamba test scaffolding: causal_conv1d_update of more than one token")
    slots = conv_state_indices.long()
    full = torch.cat([conv_state[slots].float(), x.float()[:, :, None]], dim=2)  # [batch, dim, width]
    y = (full * weight.float()[None]).sum(-1)
    if bias is not None:
        y = y + bias.float()
    conv_state[slots] = full[:, :, 1:].to(conv_state.dtype)
    return _activate(y, activation).to(x.dtype)


def _gates(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=beta, threshold=threshold)
    return g, torch.sigmoid(b.float())


def _delta_rule(q, k, v, log_g, beta, state, normalize):
    """One sequence: q, k [T, H, K], v [T, HV, V], log decay and beta [T, HV], state [HV, V, K]
    in float32 (updated in place); returns the outputs [T, HV, V]."""
    groups = v.shape[1] // q.shape[1]
    q, k = q.float().repeat_interleave(groups, 1), k.float().repeat_interleave(groups, 1)
    if normalize:
        q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
    q = q * q.shape[-1] ** -0.5
    out = []
    for t in range(q.shape[0]):
        state.mul_(torch.exp(log_g[t])[:, None, None])
        old = torch.einsum("hvk,hk->hv", state, k[t])
        new = beta[t][:, None] * v[t].float() + (1 - beta[t][:, None]) * old
        state.add_((new - old)[:, :, None] * k[t][:, None, :])
        out.append(torch.einsum("hvk,hk->hv", state, q[t]))
    return torch.stack(out)


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, cu_seqlens, head_first=False,
                               use_qk_l2norm_in_kernel=False, initial_state_indices=None, **unsupported):
    """The chunked prefill's result, computed token by token: q, k [1, T, H, K], v [1, T, HV, V],
    g (log decay) and beta [1, T, HV]; the slots' states in ``initial_state`` updated in place."""
    if head_first or any(value is not None for value in unsupported.values()):
        raise NotImplementedError("sgl_kernel.mamba test scaffolding: chunk_gated_delta_rule with "
                                  f"head_first={head_first}, {sorted(unsupported)}")
    out = torch.empty(v.shape, dtype=v.dtype)
    starts = cu_seqlens.tolist()
    for i in range(len(starts) - 1):
        s, e, slot = starts[i], starts[i + 1], int(initial_state_indices[i])
        state = initial_state[slot].float()
        out[0, s:e] = _delta_rule(q[0, s:e], k[0, s:e], v[0, s:e], g[0, s:e].float(), beta[0, s:e].float(), state,
                                  use_qk_l2norm_in_kernel).to(v.dtype)
        initial_state[slot] = state.to(initial_state.dtype)
    return out, None, None


def _fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):
    g, b_out = _gates(A_log, a, b, dt_bias, beta, threshold)
    return g[None], b_out[None]


def _fused_sigmoid_gating_delta_rule_update(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                                            initial_state_indices, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                                            softplus_beta=1.0, softplus_threshold=20.0, **unsupported):
    """The decode step: one token per sequence (q, k [1, B, H, K], v [1, B, HV, V], a and b [B, HV])."""
    if any(value not in (None, False) for value in unsupported.values()):
        raise NotImplementedError(f"sgl_kernel.mamba test scaffolding: the decode update with {sorted(unsupported)}")
    g, beta = _gates(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
    out = torch.empty(v.shape, dtype=v.dtype)
    for i in range(v.shape[1]):
        slot = int(initial_state_indices[i])
        state = initial_state_source[slot].float()
        out[0, i] = _delta_rule(q[0, i:i + 1], k[0, i:i + 1], v[0, i:i + 1], g[i:i + 1], beta[i:i + 1], state,
                                use_qk_l2norm_in_kernel)[0].to(v.dtype)
        initial_state_source[slot] = state.to(initial_state_source.dtype)
    return out


def _fused_rmsnorm_gated(x, weight, g, eps):
    """Qwen3-Next's gated norm as SGLang's CPU op computes it: RMS-normed x times the weight, then
    times SiLU of the gate, per row of x [rows, head size]."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * F.silu(g.float())).to(x.dtype)



def _ssm_step(state, x, dt, A, B, C, D):
    """One token of Mamba-2's recurrence: state [H, P, N] (float32, updated in place), x and dt
    [H, P] (dt already softplus'd), A [H, P, N], B and C [H, N], D [H, P]; returns y [H, P]."""
    state.mul_(torch.exp(dt[:, :, None] * A)).add_((dt * x)[:, :, None] * B[:, None, :])
    y = (state * C[:, None, :]).sum(-1)
    return y if D is None else y + D * x


def _dt(dt, dt_bias, softplus, limit=(0.0, float("inf"))):
    dt = dt.float() + (0.0 if dt_bias is None else dt_bias.float())
    return (F.softplus(dt) if softplus else dt).clamp(*limit)


def mamba_chunk_scan_combined_cpu(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                  seq_idx=None, chunk_indices=None, chunk_offsets=None, cu_seqlens=None,
                                  dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                                  return_varlen_states=False, return_intermediate_states=False,
                                  return_track_states=False, track_seq_idx=None, track_end_locs=None, out=None,
                                  state_dtype=None):
    """The chunked scan's result over the sequences of ``cu_seqlens``, token by token: x [1, T, H,
    P], dt [1, T, H], A [H], B and C [1, T, G, N]; writes ``out`` and returns (None, the sequences'
    final states [R, H, P, N], None) as SGLang's mixer asks for them (no chunk states, no tracking)."""
    if (z is not None or not return_varlen_states or return_final_states or return_intermediate_states
            or (track_end_locs is not None and track_end_locs.numel())):
        raise NotImplementedError("sgl_kernel.mamba test scaffolding: mamba_chunk_scan_combined in another form")
    heads, groups = x.shape[2], B.shape[2]
    starts = cu_seqlens.tolist()
    A = A.float()[:, None, None].expand(heads, x.shape[3], B.shape[3])
    finals = []
    for i in range(len(starts) - 1):
        state = (initial_states[i].float().clone() if initial_states is not None
                 else x.new_zeros(heads, x.shape[3], B.shape[3], dtype=torch.float32))
        for t in range(starts[i], starts[i + 1]):
            step_dt = _dt(dt[0, t][:, None].expand(heads, x.shape[3]), None if dt_bias is None else dt_bias[:, None],
                          dt_softplus, dt_limit)
            y = _ssm_step(state, x[0, t].float(), step_dt, A, B[0, t].float().repeat_interleave(heads // groups, 0),
                          C[0, t].float().repeat_interleave(heads // groups, 0), None if D is None else D.float()[:, None])
            out[0, t] = y.to(out.dtype)
        finals.append(state.to(state_dtype or x.dtype))
    varlen = torch.stack(finals)
    return (None, varlen, None) if return_track_states else varlen


def selective_state_update_cpu(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None, pad_slot_id=-1, out=None, disable_state_update=False,
                               **unsupported):
    """One decode token per sequence against its slot's state: x and dt [batch, H, P], A [H, P, N],
    B and C [batch, G, N], D and dt_bias [H, P]; the state updated in place, ``out`` written."""
    if z is not None or disable_state_update or x.dim() != 3 or any(v not in (None, 0) for v in unsupported.values()):
        raise NotImplementedError("sgl_kernel.mamba test scaffolding: selective_state_update in another form")
    heads, groups = x.shape[1], B.shape[1]
    for i in range(x.shape[0]):
        slot = int(state_batch_indices[i]) if state_batch_indices is not None else i
        if slot == pad_slot_id:
            continue
        h = state[slot].float()
        y = _ssm_step(h, x[i].float(), _dt(dt[i], dt_bias, dt_softplus), A.float(),
                      B[i].float().repeat_interleave(heads // groups, 0), C[i].float().repeat_interleave(heads // groups, 0),
                      None if D is None else D.float())
        state[slot] = h.to(state.dtype)
        out[i] = y.to(out.dtype)

# Python functions under torch.ops' names (SGLang calls them through torch.ops.sgl_kernel)
for _name, _fn in (("fused_gdn_gating_cpu", _fused_gdn_gating),
                   ("fused_sigmoid_gating_delta_rule_update_cpu", _fused_sigmoid_gating_delta_rule_update),
                   ("fused_rmsnorm_gated_cpu", _fused_rmsnorm_gated)):
    setattr(torch.ops.sgl_kernel, _name, _fn)
