import math

import torch

#: set from a variant's Definition (a plain one sets neither: no window, no cap)
WINDOW_LEFT = -1  # each query attends its WINDOW_LEFT + 1 latest keys, itself included (-1: every key)
LOGITS_SOFT_CAP = 0.0  # the logits become cap * tanh(logits / cap) (0: no cap)
ATTENTION_CHUNK = 0  # each query attends only the keys of its own chunk of ATTENTION_CHUNK positions (0: no chunks)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None, kv_last_page_len=None, k_scale=None,
        v_scale=None, q_scale=None, sinks=None):
    """Per request: gather its pages, attend in float32 (causal, bottom-right aligned), log2 LSE; an
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
    if qo_indptr is None:  # decode: one query per request
        qo_indptr = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    k_cache = k_cache.reshape(-1, page_size, num_kv_heads, head_dim)
    v_cache = v_cache.reshape(-1, page_size, num_kv_heads, head_dim)
    output = torch.zeros(q.shape, dtype=out_dtype, device=q.device)
    lse = torch.full(q.shape[:2], -float("inf"), dtype=torch.float32, device=q.device)
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
