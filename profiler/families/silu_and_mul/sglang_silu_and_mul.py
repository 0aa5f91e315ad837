import torch
from sglang.jit_kernel.activation import silu_and_mul


def run(input):
    """SGLang's ``SiluAndMul.forward_cuda``: its JIT activation kernel (not FlashInfer's)."""
    out = torch.empty(input.shape[:-1] + (input.shape[-1] // 2,), dtype=input.dtype, device=input.device)
    silu_and_mul(input, out)
    return out
