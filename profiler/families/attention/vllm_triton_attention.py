import torch
from vllm.v1.attention.backends.triton_attn import MIN_LAUNCH_GRID_SIZE_2D, NUM_PAR_SOFTMAX_SEGMENTS
from vllm.v1.attention.ops.triton_unified_attention import unified_attention

#: set from a variant's Definition (a plain one sets neither: no window, no cap)
WINDOW_LEFT = -1  # each query attends its WINDOW_LEFT + 1 latest keys, itself included (-1: every key)
LOGITS_SOFT_CAP = 0.0  # the logits become cap * tanh(logits / cap) (0: no cap)

#: layout -> (the kernel's index arguments, the index tensors they were built from, kept alive so
#: that their addresses cannot be taken by other tensors while the layout is cached)
_LAYOUTS = {}
#: (layout, k_scale, v_scale) -> the kernel's scale arguments
_DESCALES = {}


def _layout(q, k_cache, kv_indptr, kv_indices, qo_indptr, kv_last_page_len):
    """The paged layout in vLLM's terms (block table, tokens per sequence, query offsets, and the
    split-softmax buffers its decode path uses), built once per layout as vLLM's metadata builder
    builds it once per step for all layers."""
    tensors = (kv_indptr, kv_indices, qo_indptr, kv_last_page_len)
    key = (tuple(q.shape), tuple(k_cache.shape)) + tuple(None if t is None else (t.data_ptr(), t.numel()) for t in tensors)
    if key in _LAYOUTS:
        return _LAYOUTS[key][0]
    device = q.device
    page_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    batch = kv_indptr.numel() - 1
    pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    max_pages = max(int(pages.max()) if batch else 0, 1)
    owner = torch.repeat_interleave(torch.arange(batch, device=device), pages)
    slot = torch.arange(kv_indices.numel(), device=device) - kv_indptr[:-1].to(torch.int64)[owner]
    block_table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
    block_table[owner, slot] = kv_indices.to(torch.int32)
    last = kv_last_page_len if kv_last_page_len is not None else torch.full_like(pages, page_size)
    seqused_k = torch.where(pages > 0, (pages - 1) * page_size + last.to(torch.int64), 0).to(torch.int32)
    if qo_indptr is None:  # decode: one query token per sequence
        cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
        max_seqlen_q = 1
    else:
        cu_seqlens_q = qo_indptr.to(torch.int32)
        max_seqlen_q = int((qo_indptr[1:] - qo_indptr[:-1]).max()) if batch else 1
    threshold = MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
    padded = 1 << (head_dim - 1).bit_length()
    segments = (threshold, q.shape[1], NUM_PAR_SOFTMAX_SEGMENTS)
    layout = dict(
        cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, seqused_k=seqused_k,
        max_seqlen_k=int(seqused_k.max()) if batch else 0, block_table=block_table,
        seq_threshold_3D=threshold, num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
        softmax_segm_output=torch.empty(*segments, padded, dtype=torch.float32, device=device),
        softmax_segm_max=torch.empty(segments, dtype=torch.float32, device=device),
        softmax_segm_expsum=torch.empty(segments, dtype=torch.float32, device=device),
    )
    _LAYOUTS[key] = (layout, tensors)
    return layout


def _descales(layout, num_kv_heads, k_scale, v_scale, q_scale):
    """The scales as vLLM passes its layer's: the KV ones as one-element tensors expanded per
    sequence and KV head (1.0 for a bf16 cache), the queries' as one element (None for queries
    that are not FP8), made once per layout and value."""
    key = (id(layout), float(k_scale), float(v_scale), q_scale)
    found = _DESCALES.get(key)
    if found is None:
        shape, device = layout["block_table"].shape[0], layout["block_table"].device
        found = _DESCALES[key] = dict(
            q_descale=None if q_scale is None else torch.tensor([float(q_scale)], dtype=torch.float32, device=device),
            **{name: torch.tensor([float(value)], dtype=torch.float32, device=device).expand(shape, num_kv_heads)
               for name, value in (("k_descale", k_scale), ("v_descale", v_scale))})
    return found


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None, kv_last_page_len=None, k_scale=1.0,
        v_scale=1.0, q_scale=None, sinks=None):
    """vLLM's Triton unified attention (the TRITON_ATTN backend's kernel) on the paged cache, causal,
    as vLLM calls it: decode steps of few sequences on its split-softmax (3D) path; an FP8 (e4m3)
    cache dequantized in the kernel by ``k_scale`` and ``v_scale``, the queries in bfloat16 or (on
    CUDA, as its TRITON_ATTN backend runs ``kv_cache_dtype="fp8"``) in FP8 by ``q_scale``; a sliding
    window, soft cap and sinks as vLLM passes its layer's (``window_size`` is vLLM's ``(W - 1, 0)``).
    It returns no log-sum-exp: only ``output`` is computed."""
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
        _DESCALES.clear()
    layout = _layout(q, k_cache, kv_indptr, kv_indices, qo_indptr, kv_last_page_len)
    descales = _descales(layout, k_cache.shape[2], k_scale, v_scale, q_scale)
    out = torch.empty(q.shape, dtype=torch.bfloat16 if q_scale is not None else q.dtype, device=q.device)
    unified_attention(q=q, k=k_cache, v=v_cache, out=out, softmax_scale=float(sm_scale), causal=True,
                      window_size=(WINDOW_LEFT, 0) if WINDOW_LEFT >= 0 else (-1, -1), softcap=LOGITS_SOFT_CAP,
                      sinks=None if sinks is None else sinks.float(), **layout, **descales)
    return out
