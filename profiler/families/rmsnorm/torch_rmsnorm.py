import torch.nn.functional as F

EPS = 1e-6
WEIGHT_OFFSET = 0.0  # Gemma's norms scale by (1 + weight): 1.0, set from their Definitions


def run(hidden_states, weight, residual=None):
    x = hidden_states if residual is None else hidden_states.float() + residual.float()
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float() + WEIGHT_OFFSET, eps=EPS).to(hidden_states.dtype)
