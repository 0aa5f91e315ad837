import torch.nn.functional as F

APPROXIMATE = "tanh"  # set from the Definition: GELU's tanh approximation, or "none" (exact)


def run(input):
    gate, up = input.chunk(2, dim=-1)
    return (F.gelu(gate.float(), approximate=APPROXIMATE) * up.float()).to(input.dtype)
