import flashinfer


def run(input):
    return flashinfer.activation.silu_and_mul(input)
