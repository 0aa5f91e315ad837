import torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

#: set from a variant's Definition (a plain one sets neither: no window, no cap)
WINDOW_LEFT = -1  # each query attends its WINDOW_LEFT + 1 latest keys, itself included (-1: every key)
LOGITS_SOFT_CAP = 0.0  # the logits become cap * tanh(logits / cap) (0: no cap)
#: SGLang's default ``--triton-attention-num-kv-splits``
MAX_KV_SPLITS = 8
#: layout -> (the kernel's index arguments, the tensors they were built from, kept alive so that
#: their addresses cannot be taken by other tensors while the layout is cached)
_LAYOUTS = {}


def _decode_layout(q, kv_indptr, kv_indices, num_kv_heads):
    """The split-KV buffers, the splits per sequence and the indices, as SGLang's Triton backend sets
    them up once per step for all layers (``get_num_kv_splits``; its token indices are int64, and
    the decode kernel reads int32 ones 11% faster: ``benchmarks/sglang_decode_conditions.py``)."""
    key = ("decode", tuple(q.shape), kv_indptr.data_ptr(), kv_indptr.numel(), kv_indices.data_ptr(), kv_indices.numel())
    if key not in _LAYOUTS:
        batch, heads, head_dim = q.shape
        seq_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
        splits = torch.empty(batch, dtype=torch.int32, device=q.device)
        get_num_kv_splits_triton[(1,)](
            splits, seq_lens, batch, 1, heads, num_kv_heads, MAX_KV_SPLITS,
            torch.cuda.get_device_properties(q.device).multi_processor_count,
            MAX_NUM_SEQ=max(256, 1 << (batch - 1).bit_length()),
        )
        layout = dict(
            attn_logits=torch.empty(batch, heads, MAX_KV_SPLITS, head_dim, dtype=torch.float32, device=q.device),
            attn_lse=torch.empty(batch, heads, MAX_KV_SPLITS, dtype=torch.float32, device=q.device),
            num_kv_splits=splits,
            kv_indices=kv_indices.to(torch.int64),
        )
        _LAYOUTS[key] = (layout, (kv_indptr, kv_indices))
    return _LAYOUTS[key][0]


def _window(kv_indptr, kv_indices, keys):
    """Each sequence's last ``keys`` keys, as SGLang's Triton backend hands a windowed layer's decode
    (``update_sliding_window_buffer``: its window's indices and offsets, made once per step)."""
    key = ("window", keys, kv_indptr.data_ptr(), kv_indptr.numel(), kv_indices.data_ptr(), kv_indices.numel())
    if key not in _LAYOUTS:
        lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
        kept = lens.clamp(max=keys)
        indptr = torch.cat([kept.new_zeros(1), kept.cumsum(0)]).to(kv_indptr.dtype)
        owner = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), kept)
        offset = torch.arange(int(kept.sum()), device=lens.device) - indptr[:-1].to(torch.int64)[owner]
        indices = kv_indices[(kv_indptr[:-1].to(torch.int64) + lens - kept)[owner] + offset]
        _LAYOUTS[key] = ((indptr, indices), (kv_indptr, kv_indices))
    return _LAYOUTS[key][0]


def _extend_layout(q, keys, values, qo_indptr, kv_indptr, kv_indices):
    """The cached prefix of each sequence (SGLang's ``kv_indptr`` / ``kv_indices`` of an extend step)
    and the new tokens' keys and values, which SGLang passes contiguous beside the cache; its index
    dtypes (``qo_indptr`` and ``kv_indices`` int64, ``kv_indptr`` int32)."""
    tensors = (keys, values, qo_indptr, kv_indptr, kv_indices)
    key = ("extend", tuple(q.shape)) + tuple((t.data_ptr(), t.numel()) for t in tensors)
    if key not in _LAYOUTS:
        device = q.device
        q_lens = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
        prefix_lens = kv_lens - q_lens
        owner = torch.repeat_interleave(torch.arange(kv_lens.numel(), device=device), kv_lens)
        position = torch.arange(kv_indices.numel(), device=device) - kv_indptr[:-1].to(torch.int64)[owner]
        in_prefix = position < prefix_lens[owner]
        new = kv_indices[~in_prefix].to(torch.int64)
        layout = dict(
            k_extend=keys[new].contiguous(), v_extend=values[new].contiguous(),
            qo_indptr=qo_indptr.to(torch.int64),
            kv_indptr=torch.cat([prefix_lens.new_zeros(1), prefix_lens.cumsum(0)]).to(torch.int32),
            kv_indices=kv_indices[in_prefix].to(torch.int64),
            max_len_extend=int(q_lens.max()) if q_lens.numel() else 0,
        )
        _LAYOUTS[key] = (layout, tensors)
    return _LAYOUTS[key][0]


def _queries(q, q_scale):
    """The queries as SGLang passes them, in the model's dtype. FP8 ones (over an FP8 cache its
    grouped decode kernel casts the queries to FP8 itself, unscaled) are widened exactly to
    bfloat16; the kernel's own cast gives them back unchanged."""
    if q.dtype.itemsize > 1:
        return q
    if float(q_scale) != 1.0:
        raise ValueError(f"SGLang's Triton decode casts the queries to FP8 unscaled; q_scale {q_scale}")
    return q.to(torch.bfloat16)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None, k_scale=1.0, v_scale=1.0, q_scale=1.0,
        sinks=None, kv_last_page_len=None):
    """SGLang's Triton attention backend on its token-granular cache (page size 1), causal: the
    split-KV decode kernel, or the extend kernel (the cached prefix from the cache, the new
    tokens' keys and values beside it); an FP8 cache read times ``k_scale`` and ``v_scale``; a
    window, a tanh soft cap and sinks as SGLang passes its layer's (a windowed decode reads the
    window's keys alone, an extend masks by ``sliding_window_size`` = ``WINDOW_LEFT``). It returns
    no log-sum-exp: only ``output`` is computed. ``kv_last_page_len``, which some Definitions take,
    is 1 on its page size of 1 (every page full): not read."""
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    q = _queries(q, q_scale)
    keys, values = k_cache.flatten(0, 1), v_cache.flatten(0, 1)  # [tokens, kv heads, head dim]
    out = torch.empty_like(q)
    if qo_indptr is None:
        if WINDOW_LEFT >= 0:
            kv_indptr, kv_indices = _window(kv_indptr, kv_indices, WINDOW_LEFT + 1)
        layout = _decode_layout(q, kv_indptr, kv_indices, k_cache.shape[2])
        decode_attention_fwd(q, keys, values, out, kv_indptr, layout["kv_indices"], layout["attn_logits"], layout["attn_lse"],
                             layout["num_kv_splits"], MAX_KV_SPLITS, float(sm_scale), float(k_scale), float(v_scale),
                             logit_cap=float(LOGITS_SOFT_CAP), sinks=sinks,
                             use_pdl=torch.cuda.get_device_capability(q.device)[0] >= 9, page_size=1)
        return out
    layout = _extend_layout(q, keys, values, qo_indptr, kv_indptr, kv_indices)
    extend_attention_fwd(q, layout["k_extend"], layout["v_extend"], out, keys, values, layout["qo_indptr"],
                         layout["kv_indptr"], layout["kv_indices"], None, True, None, layout["max_len_extend"],
                         float(k_scale), float(v_scale), float(sm_scale), logit_cap=float(LOGITS_SOFT_CAP), page_size=1,
                         sliding_window_size=int(WINDOW_LEFT), sinks=sinks)
    return out
