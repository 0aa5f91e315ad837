import torch.nn.functional as F


def run(input):
    gate, up = input.chunk(2, dim=-1)
    return F.silu(gate) * up
