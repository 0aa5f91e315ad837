"""SGLang's Triton ``causal_conv1d_fn``, as its Gated DeltaNet layers call it over prefills on CUDA
(with a bias where the Definition has one): over the tokens channels first (the transposed view the
layer passes), the requests' slots of ``conv_state`` updated in place. The requests' lengths, which
the engine has on the host, are read back from ``cu_seqlens`` in the call."""

from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_fn


def run(x, conv_state, weight, cu_seqlens, conv_state_indices, has_initial_state, bias=None):
    lengths = cu_seqlens.diff().tolist()
    output = causal_conv1d_fn(x.t(), weight, bias, conv_states=conv_state, query_start_loc=cu_seqlens,
                              seq_lens_cpu=lengths, cache_indices=conv_state_indices,
                              has_initial_state=has_initial_state, activation="silu")
    return output.t()
