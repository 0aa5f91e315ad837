import flashinfer

EPS = 1e-6


def run(hidden_states, weight):
    return flashinfer.norm.rmsnorm(hidden_states, weight, eps=EPS)
