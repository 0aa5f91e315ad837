import torch


def run(A, A_scale, B, B_scale):
    """``torch._scaled_mm`` (cuBLASLt's FP8 GEMM): per-tensor scales as 0-D tensors, or row-wise
    (one per token of A as [M, 1], one per channel of B as [1, N]); its second operand
    column-major, as the engines pass the weight (B.T of a row-major [N, K])."""
    rowwise = A_scale.dim() > 0
    scale_a = A_scale.reshape(-1, 1) if rowwise else A_scale
    scale_b = B_scale.reshape(1, -1) if rowwise else B_scale
    return torch._scaled_mm(A, B.T, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
