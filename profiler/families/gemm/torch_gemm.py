import torch.nn.functional as F


def run(A, B, bias=None):
    return F.linear(A, B, bias)
