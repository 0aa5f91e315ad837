"""vLLM's Triton ``causal_conv1d_update``, as its Gated DeltaNet and Mamba-2 layers call it over
one-token requests (with a bias where the Definition has one): in place, the output over ``x``
and the requests' slots of ``conv_state``. Slot 0 is a slot as any other (the engine's kernels
skip its null block, 0, by default; a Definition skips -1 alone)."""

from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update


def run(x, conv_state, weight, conv_state_indices, bias=None):
    causal_conv1d_update(x, conv_state, weight, bias, "silu", conv_state_indices=conv_state_indices,
                         null_block_id=-1)
