"""vLLM's Mamba-2 mixers (``MambaMixer2``: Nemotron-H, Granite-4, Falcon-H1, Zamba2): each step's
causal conv1d and selective state space recurrence as ``causal_conv1d_*_bias`` (where the layer's
conv has a bias), ``mamba_ssd_prefill_*`` and ``mamba_ssu_decode_*`` calls, read from the layer's
metadata in the forward context (its prefill and decode request counts, the requests' state slots)
and the step's host query starts. Its projections are linear layers and its gated norm
(``Mixer2RMSNormGated``) a layer of its own, each hooked where they run.

The layer runs its prefill requests first, then its decode requests, each as a conv1d and then
the recurrence: ``causal_conv1d_fn`` and the chunked scan over the prefills,
``causal_conv1d_update`` and ``selective_state_update`` over the decodes.

Eagerly the layer's ``forward`` is hooked as it runs; in a compiled forward (where the core op is
opaque and runs no Python hook of ours) the hook, traced once, gives the calls to build in each
step from that step's metadata, as the attention layers do."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import judged_once, require, seen
from fi_profile.families import causal_conv1d, mamba
from fi_profile.hooks.vllm.recurrent_state import layer_metadata, query_starts, state_cache, state_slots

#: the layer classes whose core op computes the mamba Definitions
COVERED_CLASSES = ("MambaMixer2",)
#: metadata of modes the Definitions do not follow: prefix caching of the states (vLLM 0.26's
#: per-block state indices, 0.32's checkpoints)
_PREFIX_CACHING = ("block_idx_last_scheduled_token", "checkpoint_chunk_idx")


def _ranks(layer: Any) -> int:
    return int(getattr(layer, "tp_size", 1) or 1)


def _sizes(layer: Any) -> tuple[int, int, int, int]:
    """Heads and groups per rank (as the layer splits them), head size, state size."""
    ranks = _ranks(layer)
    return int(layer.num_heads) // ranks, int(layer.head_dim), int(layer.ssm_state_size), int(layer.n_groups) // ranks


def _conv_channels(layer: Any) -> int:
    """The conv1d's channels per rank, as the layer splits its projection (x, then B and C of its
    groups), never from its weight (a CPU backend may repack a linear layer's)."""
    ranks = _ranks(layer)
    return int(layer.intermediate_size) // ranks + 2 * (int(layer.n_groups) * int(layer.ssm_state_size)) // ranks


def _state_dtype(layer: Any) -> Optional[torch.dtype]:
    """The SSM state cache's dtype (``mamba_ssm_cache_dtype``), where the layer can say it."""
    try:
        return layer.get_state_dtype()[1]
    except (AssertionError, AttributeError, IndexError, TypeError):
        return None


def recurrence_problem(layer: Any, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the layer's recurrence is no mamba Definition's (its class, sizes, modes, dtypes; its
    activations' where known: at a call), or None."""
    name = type(layer).__name__
    if name not in COVERED_CLASSES:
        return f"{name} (a Mamba layer class no Definition computes)"
    if getattr(layer, "use_replayssm", False):
        return f"{name} with ReplaySSM decode (its state replayed from caches of inputs: no Definition computes it)"
    heads, _, _, groups = _sizes(layer)
    parameters = {p: getattr(layer, p).dtype for p in mamba.PARAMETER_DTYPES if isinstance(getattr(layer, p, None), torch.Tensor)}
    problem = mamba.layer_problem(heads, groups, dtype, _state_dtype(layer), parameters)
    return f"{name}: {problem}" if problem else None


def conv_problem(layer: Any, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    problem = causal_conv1d.layer_problem(getattr(layer, "activation", None), dtype)
    return f"{type(layer).__name__}'s {problem}" if problem else None


def layer_problem(layer: Any) -> Optional[str]:
    """What the record misses of the layer: its recurrence's problem, else its conv1d's."""
    return recurrence_problem(layer) or conv_problem(layer)


def _problem(layer: Any, hidden_states: torch.Tensor, mup_vector: Optional[torch.Tensor]) -> Optional[str]:
    if mup_vector is not None:
        return f"{type(layer).__name__} with a muP vector (its projections scaled elementwise: no Definition computes it)"
    return recurrence_problem(layer, hidden_states.dtype) or conv_problem(layer, hidden_states.dtype)


def _calls(layer: Any) -> list[KernelCall]:
    metadata = layer_metadata(layer.prefix)
    if metadata is None or not (int(metadata.num_prefill_tokens) + int(metadata.num_decode_tokens)):
        return []  # profiling / dummy run
    if getattr(metadata, "num_accepted_tokens", None) is not None:
        raise NotImplementedError("Mamba-2's speculative (multi-token) decode steps: no mamba Definition computes them")
    for mode in _PREFIX_CACHING:
        if getattr(metadata, mode, None) is not None:
            raise NotImplementedError(f"Mamba-2 with prefix caching of its states ({mode}): no mamba Definition "
                                      "follows its per-block states")
    heads, head_dim, state, groups = _sizes(layer)
    conv = (_conv_channels(layer), int(layer.conv_kernel_size), str(layer.activation), state_slots(layer, 0))
    bias = getattr(layer.conv1d, "bias", None) is not None
    ssm = (heads, head_dim, state, groups, state_slots(layer, 1))
    state_dtype = state_cache(layer, 1).dtype
    decodes, prefills = int(metadata.num_decodes), int(metadata.num_prefills)
    calls = []
    if prefills:
        starts = query_starts(metadata, decodes, prefills)
        if int(starts[-1]) != int(metadata.num_prefill_tokens):
            raise RuntimeError(f"the step's prefill query starts sum to {int(starts[-1])} tokens, its Mamba-2 "
                               f"metadata says {int(metadata.num_prefill_tokens)}")
        slots, flags = metadata.state_indices_tensor_p, metadata.has_initial_states_p

        def prefill_slots() -> torch.Tensor:
            return slots[:prefills].to(torch.int32)

        def initial() -> torch.Tensor:
            return torch.zeros(prefills, dtype=torch.bool) if flags is None else flags[:prefills].clone()

        calls += [causal_conv1d.prefill_call(*conv, starts, prefill_slots, initial, bias),
                  mamba.prefill_call(*ssm, starts, prefill_slots, initial, state_dtype)]
    if decodes:
        decode_slots = metadata.state_indices_tensor_d  # [requests, 1 + speculative tokens]: the first is the slot

        def slots_d() -> torch.Tensor:
            slots = decode_slots[:decodes]
            return (slots[:, 0] if slots.dim() == 2 else slots).to(torch.int32)

        calls += [causal_conv1d.decode_call(*conv, decodes, slots_d, bias),
                  mamba.decode_call(*ssm, decodes, slots_d, state_dtype)]
    return calls


def layer_calls(self: Any, hidden_states: torch.Tensor, mup_vector: Optional[torch.Tensor] = None) -> list[KernelCall]:
    """``MambaMixer2.forward``, eagerly: the step's calls of its conv1d and recurrence."""
    seen(self)
    if mup_vector is not None:
        require(_problem(self, hidden_states, mup_vector))
    require(judged_once(self, lambda layer: _problem(layer, hidden_states, None)))
    return _calls(self)


def traced_layer_calls(self: Any, hidden_states: torch.Tensor,
                       mup_vector: Optional[torch.Tensor] = None) -> Callable[[], list[KernelCall]]:
    """While torch.compile traces the layer: how to build its calls in each step."""
    seen(self)
    require(_problem(self, hidden_states, mup_vector))
    return functools.partial(_calls, self)
