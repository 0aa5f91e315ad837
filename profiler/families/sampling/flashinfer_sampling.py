import flashinfer
import torch


def run(probs, top_k=None, top_p=None):
    """FlashInfer's rejection sampling (no sort); samples as int64 like the reference."""
    if top_k is not None and top_p is not None:
        samples = flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, top_k, top_p)
    elif top_k is not None:
        samples = flashinfer.sampling.top_k_sampling_from_probs(probs, top_k)
    else:
        samples = flashinfer.sampling.top_p_sampling_from_probs(probs, top_p)
    return samples.to(torch.int64)
