import torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

#: SGLang's default ``--triton-attention-num-kv-splits``, and the fewest KV tokens per split its
#: MLA decode cap assumes (``triton_backend._MLA_DECODE_MIN_BLOCK_KV``)
BASE_KV_SPLITS = 8
MIN_BLOCK_KV = 32
#: (layout, caches) -> (the kernels' arguments, the tensors they were built from, kept alive so that
#: their addresses cannot be taken by other tensors while the layout is cached)
_LAYOUTS = {}


def _pow2(n):
    return 1 << max(int(n) - 1, 0).bit_length()


def _cache(ckv_cache, kpe_cache):
    """The latent cache as SGLang's ``MLATokenToKVPool`` holds it: one [tokens, 1, ckv + kpe] key
    buffer, its value buffer the first ``ckv`` columns of it (a view); joined as bytes (an FP8
    cache too)."""
    keys = torch.cat([ckv_cache.view(torch.uint8), kpe_cache.view(torch.uint8)], dim=-1).view(ckv_cache.dtype)
    keys = keys.flatten(0, 1).unsqueeze(1)
    return keys, keys[..., : ckv_cache.shape[-1]]


def _decode(q, keys, values, kv_indptr, kv_indices):
    """SGLang's MLA split cap (SMs and the longest sequence, each to a power of two, at least its
    base) and its per-sequence split counts; its token indices int64."""
    batch, heads, _ = q.shape
    seq_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    longest = int(seq_lens.max()) if batch else 1
    max_splits = max(BASE_KV_SPLITS, min(_pow2(sms), _pow2(-(-longest // MIN_BLOCK_KV))))
    splits = torch.empty(batch, dtype=torch.int32, device=q.device)
    get_num_kv_splits_triton[(1,)](splits, seq_lens, batch, 1, heads, 1, max_splits, sms,
                                   MAX_NUM_SEQ=max(256, _pow2(batch)))
    return dict(keys=keys, values=values, kv_indices=kv_indices.to(torch.int64), num_kv_splits=splits,
                max_kv_splits=max_splits,
                attn_logits=torch.empty(batch, heads, max_splits, values.shape[-1], dtype=torch.float32, device=q.device),
                attn_lse=torch.empty(batch, heads, max_splits, dtype=torch.float32, device=q.device))


def _extend(keys, values, qo_indptr, kv_indptr, kv_indices):
    """An extend step as SGLang passes it: each request's cached prefix by index (``kv_indptr``
    int32, ``kv_indices`` int64), its new tokens' latent keys and values contiguous beside it."""
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)
    kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    prefix = kv_lens - q_lens
    owner = torch.repeat_interleave(torch.arange(kv_lens.numel(), device=keys.device), kv_lens)
    position = torch.arange(kv_indices.numel(), device=keys.device) - kv_indptr[:-1].to(torch.int64)[owner]
    cached = position < prefix[owner]
    new = kv_indices[~cached].to(torch.int64)
    return dict(keys=keys, values=values, k_extend=keys[new].contiguous(), v_extend=values[new].contiguous(),
                qo_indptr=qo_indptr.to(torch.int64), kv_indices=kv_indices[cached].to(torch.int64),
                kv_indptr=torch.cat([prefix.new_zeros(1), prefix.cumsum(0)]).to(torch.int32),
                max_len_extend=int(q_lens.max()) if q_lens.numel() else 0)


def _layout(q, ckv_cache, kpe_cache, kv_indptr, kv_indices, qo_indptr):
    tensors = (ckv_cache, kpe_cache, kv_indptr, kv_indices, qo_indptr)
    key = (tuple(q.shape),) + tuple(None if t is None else (t.data_ptr(), t.numel()) for t in tensors)
    if key not in _LAYOUTS:
        if len(_LAYOUTS) > 16:
            _LAYOUTS.clear()
        keys, values = _cache(ckv_cache, kpe_cache)
        layout = (_decode(q, keys, values, kv_indptr, kv_indices) if qo_indptr is None
                  else _extend(keys, values, qo_indptr, kv_indptr, kv_indices))
        _LAYOUTS[key] = (layout, tensors)
    return _LAYOUTS[key][0]


def _query(q_nope, q_pe, q_nope_scale):
    """The query as SGLang passes it: the latent joined to its rotary part, in the rotary part's
    dtype. An FP8 latent (over an FP8 cache SGLang's decode casts the query latent to FP8 itself,
    unscaled) is widened exactly; the kernel's own cast gives it back unchanged."""
    if q_nope.dtype != q_pe.dtype:
        if float(q_nope_scale) != 1.0:
            raise ValueError(f"SGLang's Triton MLA casts the query latent to FP8 unscaled; q_nope_scale {q_nope_scale}")
        q_nope = q_nope.to(q_pe.dtype)
    return torch.cat([q_nope, q_pe], dim=-1)


def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None, kv_scale=1.0,
        q_nope_scale=1.0):
    """SGLang's ``triton`` attention backend on DeepSeek's absorbed MLA (page size 1): the query
    joined to its rotary part, against the latent cache of one KV head (an FP8 one read times
    ``kv_scale``, as SGLang's decode takes the layer's k_scale and v_scale); the grouped split-KV
    decode kernel, or the extend kernel for a causal prefill (the cached prefix from the cache, the
    new tokens beside it). SGLang's log-sum-exp is scratch: only ``output`` is computed."""
    if ckv_cache.shape[1] != 1:
        raise ValueError(f"SGLang's triton MLA runs on a token-granular cache; page size {ckv_cache.shape[1]}")
    q = _query(q_nope, q_pe, q_nope_scale)
    out = q_pe.new_empty(q_nope.shape)
    scale = float(kv_scale)
    layout = _layout(q, ckv_cache, kpe_cache, kv_indptr, kv_indices, qo_indptr)
    if qo_indptr is None:
        decode_attention_fwd(q, layout["keys"], layout["values"], out, kv_indptr, layout["kv_indices"],
                             layout["attn_logits"], layout["attn_lse"], layout["num_kv_splits"],
                             layout["max_kv_splits"], float(sm_scale), scale, scale, logit_cap=0.0, has_mla=True,
                             use_pdl=torch.cuda.get_device_capability(q.device)[0] >= 9, page_size=1)
        return out
    extend_attention_fwd(q, layout["k_extend"], layout["v_extend"], out, layout["keys"], layout["values"],
                         layout["qo_indptr"], layout["kv_indptr"], layout["kv_indices"], None, True, None,
                         layout["max_len_extend"], scale, scale, float(sm_scale), logit_cap=0.0, page_size=1)
    return out
