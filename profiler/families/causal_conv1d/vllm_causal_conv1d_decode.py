"""vLLM's Triton ``causal_conv1d_update``, as its Gated DeltaNet layer calls it in a step of
one-token requests: in place, the output over ``x`` and the requests' slots of ``conv_state``."""

from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update


def run(x, conv_state, weight, conv_state_indices):
    causal_conv1d_update(x, conv_state, weight, None, "silu", conv_state_indices=conv_state_indices)
