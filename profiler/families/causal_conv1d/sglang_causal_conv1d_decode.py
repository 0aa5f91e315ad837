"""SGLang's Triton ``causal_conv1d_update``, as its Gated DeltaNet layers call it over one-token
requests on CUDA (with a bias where the Definition has one): a new output, the requests' slots of
``conv_state`` updated in place (a slot of -1 is skipped, as the Definition does)."""

from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update


def run(x, conv_state, weight, conv_state_indices, bias=None):
    return causal_conv1d_update(x, conv_state, weight, bias, "silu", conv_state_indices=conv_state_indices)
