import math

import torch


def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    """Per request: causal attention (bottom-right aligned) in float32, every head its own key and
    value; log2 LSE."""
    output = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:2], -float("inf"), dtype=torch.float32, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        if qo[b] == qo[b + 1] or kv[b] == kv[b + 1]:
            continue
        qb, kb, vb = q[qo[b] : qo[b + 1]].float(), k[kv[b] : kv[b + 1]].float(), v[kv[b] : kv[b + 1]].float()
        n_q, n_kv = qb.shape[0], kb.shape[0]
        logits = torch.einsum("qhd,khd->hqk", qb, kb) * sm_scale
        causal = torch.arange(n_kv, device=q.device)[None, :] > torch.arange(n_q, device=q.device)[:, None] + (n_kv - n_q)
        logits.masked_fill_(causal[None], -float("inf"))
        lse[qo[b] : qo[b + 1]] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).T
        output[qo[b] : qo[b + 1]] = torch.einsum("hqk,khd->qhd", logits.softmax(-1), vb).to(q.dtype)
    return output, lse
