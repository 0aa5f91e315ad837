import torch
from sgl_kernel import sgl_per_token_quant_fp8

OUTPUTS = ("x_q", "x_scale")


def run(x):
    """SGLang's dynamic per-token FP8 quantization (sgl-kernel's ``sgl_per_token_quant_fp8``: what
    its ``apply_fp8_linear`` runs on CUDA before the FP8 GEMM of a layer without weight blocks)."""
    x_q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)
    sgl_per_token_quant_fp8(x.contiguous(), x_q, scale)
    return x_q, scale.reshape(-1)
