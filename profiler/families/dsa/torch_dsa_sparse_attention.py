import math

import torch

#: tokens whose gathered keys are held at once ([tokens, topk, head_dim_ckv] in float32: 4 MiB a token)
TOKENS_AT_ONCE = 64


def run(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    num_tokens, num_heads, head_dim_ckv = q_nope.shape
    head_dim_kpe = q_pe.shape[-1]
    keys_c = ckv_cache.reshape(-1, head_dim_ckv)
    keys_p = kpe_cache.reshape(-1, head_dim_kpe)
    output = torch.zeros((num_tokens, num_heads, head_dim_ckv), dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.full((num_tokens, num_heads), -math.inf, dtype=torch.float32, device=q_nope.device)
    for first in range(0, num_tokens, TOKENS_AT_ONCE):
        rows = slice(first, first + TOKENS_AT_ONCE)
        indices = sparse_indices[rows].to(torch.long)
        valid = indices != -1
        picked = indices.clamp_min(0)
        kc = keys_c[picked].float()  # [t, topk, ckv]
        kp = keys_p[picked].float()
        logits = (torch.einsum("thc,tkc->thk", q_nope[rows].float(), kc)
                  + torch.einsum("thp,tkp->thk", q_pe[rows].float(), kp)) * sm_scale
        logits = logits.masked_fill(~valid[:, None, :], -math.inf)
        any_valid = valid.any(dim=-1)  # a token with no key keeps zeros and -inf
        row_lse = torch.logsumexp(logits, dim=-1)
        weights = torch.exp(logits - torch.where(any_valid[:, None], row_lse, 0.0)[..., None])
        out = torch.einsum("thk,tkc->thc", weights, kc)
        output[rows] = torch.where(any_valid[:, None, None], out, 0.0).to(torch.bfloat16)
        lse[rows] = torch.where(any_valid[:, None], row_lse / math.log(2.0), -math.inf)
    return output, lse
