"""vLLM's Triton ``causal_conv1d_fn``, as its Gated DeltaNet layer calls it in a step with
prefills: over the tokens channels first (the transposed view the layer passes), the requests'
slots of ``conv_state`` updated in place. Its chunking metadata, which the engine builds once per
step, is built in the call."""

from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn


def run(x, conv_state, weight, cu_seqlens, conv_state_indices, has_initial_state):
    output = causal_conv1d_fn(x.t(), weight, None, conv_states=conv_state, query_start_loc=cu_seqlens,
                              cache_indices=conv_state_indices, has_initial_state=has_initial_state,
                              activation="silu")
    return output.t()
