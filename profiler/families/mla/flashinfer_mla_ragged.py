import flashinfer
import torch

_WORKSPACE = {}
#: layout -> (planned wrapper, the index tensors it was planned for, kept alive so that their
#: addresses cannot be taken by other tensors while the plan is cached)
_PLANS = {}


def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    """FlashInfer's causal prefill over ragged q / k / v of MLA's up-projected form (q/k of
    qk_nope + qk_rope, v of v_head_dim: ``BatchPrefillWithRaggedKVCacheWrapper`` with its own value
    width, as vLLM's FlashInfer MLA prefill backend runs it). Planned once per index layout."""
    if len(_PLANS) > 64:
        _PLANS.clear()
    if q.device not in _WORKSPACE:
        _WORKSPACE[q.device] = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    key = (tuple(q.shape), tuple(v.shape), float(sm_scale), qo_indptr.data_ptr(), kv_indptr.data_ptr(), qo_indptr.numel())
    if key not in _PLANS:
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_WORKSPACE[q.device], "NHD")
        wrapper.plan(qo_indptr.to(torch.int32), kv_indptr.to(torch.int32), q.shape[1], k.shape[1], q.shape[2],
                     head_dim_vo=v.shape[2], causal=True, sm_scale=float(sm_scale), q_data_type=q.dtype,
                     kv_data_type=k.dtype)
        _PLANS[key] = (wrapper, (qo_indptr, kv_indptr))
    return _PLANS[key][0].run(q, k, v, return_lse=True)
