import torch.nn.functional as F

gate_up_size = 28672  # set from the Definition: the gate half, then the up half (gated activations only)


def run(input):
    assert input.shape[-1] == gate_up_size
    gate, up = input.chunk(2, dim=-1)
    return F.silu(gate) * up
