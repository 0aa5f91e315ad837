"""vLLM's Triton ``causal_conv1d_fn``, as its Gated DeltaNet and Mamba-2 layers call it over
prefills (with a bias where the Definition has one): over the tokens channels first (the
transposed view the layer passes), the requests' slots of ``conv_state`` updated in place. Its
chunking metadata, which the engine builds once per step, is built in the call. Slot 0 is a slot
as any other (the engine's kernels skip its null block, 0, by default; a Definition skips -1
alone)."""

from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn


def run(x, conv_state, weight, cu_seqlens, conv_state_indices, has_initial_state, bias=None):
    output = causal_conv1d_fn(x.t(), weight, bias, conv_states=conv_state, query_start_loc=cu_seqlens,
                              cache_indices=conv_state_indices, has_initial_state=has_initial_state,
                              activation="silu", null_block_id=-1)
    return output.t()
