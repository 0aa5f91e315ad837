import torch.nn.functional as F

EPS = 1e-6
WEIGHT_OFFSET = 0.0  # Gemma's norms scale by (1 + weight): 1.0, set from their Definitions
#: the Definitions this family serves: the normalized output and the new residual, as the engines' kernel
OUTPUTS = ("output", "residual_out")


def run(hidden_states, residual, weight):
    x = hidden_states.float() + residual.float()
    y = F.rms_norm(x, (x.shape[-1],), weight.float() + WEIGHT_OFFSET, eps=EPS)
    return y.to(hidden_states.dtype), x.to(hidden_states.dtype)
