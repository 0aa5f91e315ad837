import torch


def run(probs, top_k=None, top_p=None):
    """Vectorised: top-k, renormalise, top-p on the renormalised row, sample."""
    probs = probs.float()
    vals, idx = probs.sort(dim=-1, descending=True)
    if top_k is not None:
        rank = torch.arange(vals.shape[-1], device=probs.device)[None, :]
        k = top_k.long()[:, None]
        vals = torch.where((k <= 0) | (rank < k), vals, torch.zeros_like(vals))
        vals = vals / vals.sum(-1, keepdim=True)
    if top_p is not None:
        before = vals.cumsum(-1) - vals  # mass strictly before each token
        vals = torch.where(before <= top_p.float()[:, None], vals, torch.zeros_like(vals))
    choice = torch.multinomial(vals, 1).squeeze(-1)
    return idx.gather(-1, choice[:, None]).squeeze(-1).to(torch.int64)
