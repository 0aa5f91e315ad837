import torch

#: the top-k the Definition selects (its const axis ``topk``)
topk = 2048


def _dequantized(k_index_cache_fp8):
    """DeepGEMM's paged FP8 index cache ([pages, page_size, 1, head_dim + 4] bytes): per page, its
    tokens' FP8 keys, then their float32 scales."""
    cache = k_index_cache_fp8.view(torch.uint8)
    num_pages, page_size, _, with_scale = cache.shape
    head_dim = with_scale - 4
    flat = cache.view(num_pages, page_size * with_scale)
    keys = flat[:, :page_size * head_dim].contiguous().view(num_pages, page_size, head_dim).view(torch.float8_e4m3fn)
    scales = flat[:, page_size * head_dim:].contiguous().view(num_pages, page_size, 4).view(torch.float32)
    return keys.to(torch.float32) * scales


def run(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    batch_size, _, head_dim = q_index_fp8.shape
    page_size = k_index_cache_fp8.shape[1]
    keys = _dequantized(k_index_cache_fp8)
    pages = block_table.to(torch.long).clamp_min(0)  # [batch, max_pages]
    tokens = pages.shape[1] * page_size
    gathered = keys[pages].reshape(batch_size, tokens, head_dim)
    scores = torch.relu(torch.einsum("bhd,bnd->bhn", q_index_fp8.to(torch.float32), gathered))
    scores = (scores * weights[:, :, None]).sum(dim=1)  # [batch, tokens]
    position = torch.arange(tokens, device=scores.device)
    inside = position[None, :] < seq_lens.to(torch.long)[:, None]
    scores = scores.masked_fill(~inside, -torch.inf)
    k = min(topk, tokens)
    top, where = torch.topk(scores, k, dim=-1)
    token = torch.gather(pages, 1, where // page_size) * page_size + where % page_size
    topk_indices = torch.full((batch_size, topk), -1, dtype=torch.int32, device=scores.device)
    topk_indices[:, :k] = torch.where(top == -torch.inf, -1, token).to(torch.int32)
    return (topk_indices,)
