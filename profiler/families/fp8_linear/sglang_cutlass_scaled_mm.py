import torch
from sgl_kernel import fp8_scaled_mm


def run(A, A_scale, B, B_scale):
    """SGLang's CUTLASS FP8 GEMM (sgl-kernel's ``fp8_scaled_mm``: what its ``apply_fp8_linear`` runs
    on CUDA for a layer with one weight scale per output channel, FP8 checkpoints and
    compressed-tensors FP8-dynamic alike): A's scale one per token as [M, 1], B's one per channel as
    [N, 1]; the weight column-major (B.T of a row-major [N, K]), as SGLang keeps it."""
    return fp8_scaled_mm(A, B.T, A_scale.reshape(-1, 1), B_scale.reshape(-1, 1), torch.bfloat16)
