import math

import torch


def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, qo_indptr=None, kv_last_page_len=None,
        kv_scale=None, q_nope_scale=None):
    """Per request: gather its latent pages (an FP8 cache's dequantized by ``kv_scale``, an FP8
    query latent by ``q_nope_scale``), attend in float32 (causal, bottom-right aligned), the latent
    rows as values; log2 LSE (output in the rotary queries' dtype)."""
    page_size = ckv_cache.shape[1]
    batch = kv_indptr.shape[0] - 1
    if qo_indptr is None:  # decode: one query per request
        qo_indptr = torch.arange(batch + 1, device=q_nope.device, dtype=torch.int32)
    output = torch.zeros(q_nope.shape, dtype=q_pe.dtype, device=q_nope.device)
    lse = torch.full(q_nope.shape[:2], -float("inf"), dtype=torch.float32, device=q_nope.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    last = kv_last_page_len.tolist() if kv_last_page_len is not None else [page_size] * batch
    for b in range(batch):
        if qo[b] == qo[b + 1] or kv[b] == kv[b + 1]:
            continue
        pages = kv_indices[kv[b] : kv[b + 1]].long()
        n_kv = (len(pages) - 1) * page_size + last[b]
        ckv = ckv_cache[pages].reshape(-1, ckv_cache.shape[-1])[:n_kv].float()
        kpe = kpe_cache[pages].reshape(-1, kpe_cache.shape[-1])[:n_kv].float()
        if kv_scale is not None:
            ckv, kpe = ckv * kv_scale, kpe * kv_scale
        qn, qp = q_nope[qo[b] : qo[b + 1]].float(), q_pe[qo[b] : qo[b + 1]].float()
        if q_nope_scale is not None:
            qn = qn * q_nope_scale
        logits = (torch.einsum("qhd,kd->hqk", qn, ckv) + torch.einsum("qhd,kd->hqk", qp, kpe)) * sm_scale
        n_q = qn.shape[0]
        causal = torch.arange(n_kv, device=qn.device)[None, :] > torch.arange(n_q, device=qn.device)[:, None] + (n_kv - n_q)
        logits.masked_fill_(causal[None], -float("inf"))
        lse[qo[b] : qo[b + 1]] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).T
        output[qo[b] : qo[b + 1]] = torch.einsum("hqk,kd->qhd", logits.softmax(-1), ckv).to(output.dtype)
    return output, lse
