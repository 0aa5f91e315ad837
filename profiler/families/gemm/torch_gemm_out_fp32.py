import torch
import torch.nn.functional as F

OUTPUT_FLOAT32 = True


def run(A, B):
    # low-precision operands, float32 result: cuBLAS's out_dtype on CUDA, float32 operands elsewhere
    if A.is_cuda:
        return torch.mm(A, B.T, out_dtype=torch.float32)
    return F.linear(A.float(), B.float())
