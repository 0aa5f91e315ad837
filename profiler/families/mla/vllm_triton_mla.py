import torch
from vllm.v1.attention.backends.mla.triton_mla import _compute_num_kv_splits
from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

#: (layout, caches) -> (the kernel's arguments, the tensors they were built from, kept alive so that
#: their addresses cannot be taken by other tensors while the layout is cached)
_LAYOUTS = {}


def _layout(q_nope, ckv_cache, kpe_cache, kv_indptr, kv_indices, kv_last_page_len, kv_scale):
    """vLLM's terms, built once per layout as its metadata builder builds them once per step: the
    block table, tokens per sequence, the split count its TRITON_MLA backend picks for the longest
    sequence, the split buffers; the cache as vLLM holds it, one [pages, page_size, 1, ckv + kpe]
    tensor (the Definition's two caches, joined once, as bytes: FP8 caches too), and its scale as
    the one-element tensor vLLM's layer holds (``_k_scale``, passed for keys and values alike)."""
    tensors = (ckv_cache, kpe_cache, kv_indptr, kv_indices, kv_last_page_len)
    key = (tuple(q_nope.shape), float(kv_scale)) + tuple(None if t is None else (t.data_ptr(), t.numel())
                                                         for t in tensors)
    if key in _LAYOUTS:
        return _LAYOUTS[key][0]
    device, page_size = q_nope.device, ckv_cache.shape[1]
    batch, heads, ckv = q_nope.shape
    pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    max_pages = max(int(pages.max()) if batch else 0, 1)
    owner = torch.repeat_interleave(torch.arange(batch, device=device), pages)
    slot = torch.arange(kv_indices.numel(), device=device) - kv_indptr[:-1].to(torch.int64)[owner]
    block_table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
    block_table[owner, slot] = kv_indices.to(torch.int32)
    last = kv_last_page_len[:batch].to(torch.int64) if kv_last_page_len is not None else torch.full_like(pages, page_size)
    seq_lens = torch.where(pages > 0, (pages - 1) * page_size + last, 0).to(torch.int32)
    splits = _compute_num_kv_splits(int(seq_lens.max()) if batch else 1,
                                    torch.cuda.get_device_properties(device).multi_processor_count)
    cache = torch.cat([ckv_cache.view(torch.uint8), kpe_cache.view(torch.uint8)], dim=-1).view(ckv_cache.dtype)
    cache = cache.unsqueeze(2)
    scale = torch.tensor(float(kv_scale), dtype=torch.float32, device=device)
    layout = dict(k_buffer=cache, v_buffer=cache[..., :ckv], req_to_token=block_table, b_seq_len=seq_lens,
                  attn_logits=torch.empty(batch, heads, splits, ckv + 1, dtype=torch.float32, device=device),
                  num_kv_splits=splits, page_size=page_size, k_scale=scale, v_scale=scale)
    _LAYOUTS[key] = (layout, tensors)
    return layout


def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, kv_last_page_len=None, kv_scale=1.0):
    """vLLM's Triton MLA decode (its TRITON_MLA backend's ``forward_mqa``): the absorbed query joined
    to its rotary part, attended against the latent cache (an FP8 one dequantized on load by
    ``kv_scale``, bf16 queries), split over the KV and reduced. Its log-sum-exp is vLLM's own
    scratch, not the Definition's: only ``output`` is computed."""
    if len(_LAYOUTS) > 16:
        _LAYOUTS.clear()
    layout = _layout(q_nope, ckv_cache, kpe_cache, kv_indptr, kv_indices, kv_last_page_len, kv_scale)
    q = torch.cat([q_nope, q_pe], dim=-1)
    out = torch.zeros_like(q_nope)
    lse = torch.zeros(q.shape[:2], dtype=q.dtype, device=q.device)
    decode_attention_fwd(q, layout["k_buffer"], layout["v_buffer"], out, lse, layout["req_to_token"],
                         layout["b_seq_len"], layout["attn_logits"], layout["num_kv_splits"], float(sm_scale),
                         layout["page_size"], k_scale=layout["k_scale"], v_scale=layout["v_scale"], is_mla=True)
    return out
