import torch
import vllm._custom_ops  # registers torch.ops._C

EPS = 1e-6


def run(hidden_states, weight):
    out = torch.empty_like(hidden_states)
    torch.ops._C.rms_norm(out, hidden_states, weight, EPS)
    return out
