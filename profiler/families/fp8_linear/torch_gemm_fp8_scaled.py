import torch


def run(A, A_scale, B, B_scale):
    # both operands dequantized to bfloat16 (a 0-D scale per tensor, or one per token / channel), one bfloat16 GEMM
    a = A.to(torch.float32) * A_scale.reshape(-1, 1)
    b = B.to(torch.float32) * B_scale.reshape(-1, 1)
    return torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16).T)
