import torch

BLOCK_N = 128
BLOCK_K = 128


def run(A, A_scale, B, B_scale):
    # dequantize both operands to bfloat16 (their scales expanded to the blocks), one bfloat16 GEMM
    M, K = A.shape
    N = B.shape[0]
    a = A.to(torch.float32) * A_scale.repeat_interleave(BLOCK_K, dim=1)[:, :K]
    b = B.to(torch.float32) * B_scale.repeat_interleave(BLOCK_N, dim=0)[:N].repeat_interleave(BLOCK_K, dim=1)[:, :K]
    return torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16).T)
