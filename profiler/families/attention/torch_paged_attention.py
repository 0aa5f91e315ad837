import math

import torch

#: set from a variant's Definition (a plain one sets neither: no window, no cap)
WINDOW_LEFT = -1  # each query attends its WINDOW_LEFT + 1 latest keys, itself included (-1: every key)
LOGITS_SOFT_CAP = 0.0  # the logits become cap * tanh(logits / cap) (0: no cap)
ATTENTION_CHUNK = 0  # each query attends only the keys of its own chunk of ATTENTION_CHUNK positions (0: no chunks)
DECODE_BYTES = 1 << 30  # the float32 keys and values gathered for decode requests at once, at most


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None, kv_last_page_len=None, k_scale=None,
        v_scale=None, q_scale=None, sinks=None):
    """Per request (decode: every request at once, its pages gathered into rows padded to the longest
    and the padding masked): gather its pages, attend in float32 (causal, bottom-right aligned), log2 LSE; an
    FP8 cache (``k_scale``, ``v_scale`` given) and FP8 queries (``q_scale``) dequantized by their
    scales, the output then in bfloat16; a sliding window, a logit soft cap, chunks and ``sinks``
    (one logit per query head joining every softmax, its value zero) where the Definition has them."""
    k_scale = 1.0 if k_scale is None else float(k_scale)
    v_scale = 1.0 if v_scale is None else float(v_scale)
    out_dtype = q.dtype if q_scale is None else torch.bfloat16
    q_scale = 1.0 if q_scale is None else float(q_scale)
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    batch = kv_indptr.shape[0] - 1
    decode = qo_indptr is None  # one query per request
    k_cache = k_cache.reshape(-1, page_size, num_kv_heads, head_dim)
    v_cache = v_cache.reshape(-1, page_size, num_kv_heads, head_dim)
    output = torch.zeros(q.shape, dtype=out_dtype, device=q.device)
    lse = torch.full(q.shape[:2], -float("inf"), dtype=torch.float32, device=q.device)
    if decode:
        last_len = kv_last_page_len if kv_last_page_len is not None else torch.full(
            (batch,), page_size, dtype=torch.int32, device=q.device)
        step = max(1, DECODE_BYTES // max(1, _kv_bytes_per_request(kv_indptr, page_size, num_kv_heads, head_dim)))
        for start in range(0, batch, step):  # every request at once, as many as fit the budget
            rows = slice(start, min(batch, start + step))
            _decode_together(q[rows], k_cache, v_cache, kv_indptr[start : rows.stop + 1], kv_indices, last_len[rows],
                             sm_scale, k_scale, v_scale, q_scale, sinks, output[rows], lse[rows])
        return output, lse
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    last = kv_last_page_len.tolist() if kv_last_page_len is not None else [page_size] * batch
    for b in range(batch):
        if qo[b] == qo[b + 1] or kv[b] == kv[b + 1]:
            continue
        pages = kv_indices[kv[b] : kv[b + 1]].long()
        n_kv = (len(pages) - 1) * page_size + last[b]
        k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n_kv].float() * k_scale
        v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n_kv].float() * v_scale
        group = num_q_heads // num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        qb = q[qo[b] : qo[b + 1]].float() * q_scale
        logits = torch.einsum("qhd,khd->hqk", qb, k) * sm_scale
        if LOGITS_SOFT_CAP > 0:
            logits = LOGITS_SOFT_CAP * torch.tanh(logits / LOGITS_SOFT_CAP)
        n_q = qb.shape[0]
        q_pos = torch.arange(n_q, device=q.device)[:, None] + (n_kv - n_q)
        kv_pos = torch.arange(n_kv, device=q.device)[None, :]
        masked = kv_pos > q_pos
        if WINDOW_LEFT >= 0:
            masked |= kv_pos < q_pos - WINDOW_LEFT
        if ATTENTION_CHUNK > 0:
            masked |= kv_pos // ATTENTION_CHUNK != q_pos // ATTENTION_CHUNK
        logits.masked_fill_(masked[None], -float("inf"))
        if sinks is not None:
            logits = torch.cat([logits, sinks.float()[:, None, None].expand(-1, n_q, 1)], dim=-1)
        lse[qo[b] : qo[b + 1]] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).T
        probs = logits.softmax(-1)[..., :n_kv]
        output[qo[b] : qo[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(out_dtype)
    return output, lse


def _kv_bytes_per_request(kv_indptr, page_size, num_kv_heads, head_dim):
    """The float32 keys and values one decode request's row takes, padded to the longest."""
    pages = int((kv_indptr[1:] - kv_indptr[:-1]).max()) if kv_indptr.shape[0] > 1 else 0
    return 2 * pages * page_size * num_kv_heads * head_dim * 4


def _decode_together(q, k_cache, v_cache, kv_indptr, kv_indices, last_len, sm_scale, k_scale, v_scale, q_scale, sinks,
                     output, lse):
    """One query per request, the requests together: pages gathered into rows of the longest
    request's length, positions past a request's keys masked; ``output`` and ``lse`` written."""
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    counts = (kv_indptr[1:] - kv_indptr[:-1]).long()
    max_pages = int(counts.max()) if batch else 0
    if max_pages == 0:
        return
    slots = torch.arange(max_pages, device=q.device)
    has_page = slots[None, :] < counts[:, None]
    at = (kv_indptr[:-1, None].long() + slots[None, :]).clamp(max=max(kv_indices.shape[0] - 1, 0))
    pages = torch.where(has_page, kv_indices[at].long(), torch.zeros_like(at))
    n_kv = torch.where(counts > 0, (counts - 1) * page_size + last_len.long(), torch.zeros_like(counts))
    k = k_cache[pages].reshape(batch, max_pages * page_size, num_kv_heads, head_dim).float() * k_scale
    v = v_cache[pages].reshape(batch, max_pages * page_size, num_kv_heads, head_dim).float() * v_scale
    qb = q.float().reshape(batch, num_kv_heads, group, head_dim) * q_scale
    logits = torch.einsum("bhgd,bkhd->bhgk", qb, k) * sm_scale
    if LOGITS_SOFT_CAP > 0:
        logits = LOGITS_SOFT_CAP * torch.tanh(logits / LOGITS_SOFT_CAP)
    kv_pos = torch.arange(k.shape[1], device=q.device)[None, :]
    q_pos = (n_kv - 1)[:, None]
    masked = kv_pos > q_pos
    if WINDOW_LEFT >= 0:
        masked |= kv_pos < q_pos - WINDOW_LEFT
    if ATTENTION_CHUNK > 0:
        masked |= kv_pos // ATTENTION_CHUNK != q_pos // ATTENTION_CHUNK
    logits.masked_fill_(masked[:, None, None, :], -float("inf"))
    if sinks is not None:
        sink = sinks.float().reshape(1, num_kv_heads, group, 1).expand(batch, -1, -1, 1)
        logits = torch.cat([logits, sink], dim=-1)
    attended = (n_kv > 0)[:, None]  # a request with no keys keeps its zeros and -inf
    lse.copy_(torch.where(attended, (torch.logsumexp(logits, dim=-1) / math.log(2.0)).reshape(batch, num_q_heads), lse))
    probs = logits.softmax(-1)[..., : k.shape[1]]
    out = torch.einsum("bhgk,bkhd->bhgd", probs, v).reshape(batch, num_q_heads, head_dim)
    output.copy_(torch.where(attended[..., None], out.to(output.dtype), output))
