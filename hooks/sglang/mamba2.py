"""SGLang's Mamba-2 mixers (``MambaMixer2`` on its ``Mamba2AttnBackend``: Nemotron-H, Granite-4.0-H,
Falcon-H1): each step's causal conv1d and selective state space recurrence as
``causal_conv1d_*`` (``_bias`` where the conv has one), ``mamba_ssd_prefill_*`` and
``mamba_ssu_decode_*`` calls, read from the mixer's ``Mamba2Metadata`` (its prefill and decode
request counts, the requests' state slots and host lengths) and its layer's state cache. Its
projections are linear layers and its gated norm (``Mixer2RMSNormGated``) a layer of its own, each
hooked where they run.

The mixer runs a step's prefill requests first, then its decode requests, each as a conv1d and
then the recurrence: ``causal_conv1d_fn`` and the chunked scan over the prefills,
``causal_conv1d_update`` and ``selective_state_update`` over the decodes. Speculative (verify)
steps, ReplaySSM decodes and muP-scaled projections are named errors. In a CUDA graph, the calls of
each replay are built from that step's batch and the backend's metadata, as the Gated DeltaNet
layers' are."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import judged_once, require, seen, seen_weights
from fi_profile.families import causal_conv1d, mamba
from fi_profile.hooks.sglang.attention import STEP
from fi_profile.hooks.sglang.recurrent_state import linear_backend, query_starts

#: the mixer classes whose core ops compute the mamba Definitions
COVERED_CLASSES = ("MambaMixer2",)


def _ranks(layer: Any) -> int:
    return int(getattr(layer, "tp_size", 1) or 1)


def _sizes(layer: Any) -> tuple[int, int, int, int]:
    """Heads and groups per rank (as the mixer splits them: its groups widened where the ranks do
    not divide them), head size, state size."""
    ranks = _ranks(layer)
    return int(layer.num_heads) // ranks, int(layer.head_dim), int(layer.ssm_state_size), int(layer.n_groups) // ranks


def _conv(layer: Any) -> tuple[int, int, str]:
    """The conv1d's channels per rank (the mixer's ``conv_dim``, split over the ranks), its width
    (the conv layer's input size) and activation: never from its weight, which a CPU backend may
    repack as a linear layer's."""
    return int(layer.conv_dim) // _ranks(layer), int(layer.conv1d.input_size), str(layer.activation)


def layer_problem(layer: Any, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the mixer's conv1d and recurrence are no Definitions' (its class, sizes, parameters'
    dtypes; its activations' where known: at a call), or None."""
    name = type(layer).__name__
    if name not in COVERED_CLASSES:
        return f"{name} (a Mamba layer class no Definition computes)"
    heads, _, _, groups = _sizes(layer)
    parameters = {p: getattr(layer, p).dtype for p in mamba.PARAMETER_DTYPES
                  if isinstance(getattr(layer, p, None), torch.Tensor)}
    problem = mamba.layer_problem(heads, groups, dtype, None, parameters)
    if problem:
        return f"{name}: {problem}"
    problem = causal_conv1d.layer_problem(getattr(layer, "activation", None), dtype)
    return f"{name}'s {problem}" if problem else None


def _step_problem(metadata: Any, mup_vector: Optional[torch.Tensor]) -> Optional[str]:
    if mup_vector is not None:
        return "MambaMixer2 with a muP vector (its projections scaled elementwise: no Definition computes it)"
    if getattr(metadata, "replayssm_write_pos", None) is not None:
        return "MambaMixer2 with ReplaySSM decode (its state replayed from caches of inputs: no Definition computes it)"
    return None


def _cache(layer_cache: Any) -> tuple[int, int, torch.dtype]:
    """Slots of the layer's conv and SSM state caches (their first dimension), the SSM state's dtype."""
    conv, ssm = layer_cache.conv[0], layer_cache.temporal
    return int(conv.shape[0]), int(ssm.shape[0]), ssm.dtype


def _speculative(metadata: Any) -> None:
    if getattr(metadata, "is_target_verify", False):
        raise NotImplementedError("Mamba-2's speculative (multi-token) verify steps: no mamba Definition computes them")


def _calls(layer: Any, cache: tuple[int, int, torch.dtype], metadata: Any) -> list[KernelCall]:
    """The mixer's calls in a step, from its ``Mamba2Metadata`` (prefills first, then decodes)."""
    _speculative(metadata)
    prefills, decodes = int(metadata.num_prefills), int(metadata.num_decodes)
    calls = []
    if prefills:
        mixed = metadata.mixed_metadata
        lengths = mixed.extend_seq_lens_cpu
        starts = (query_starts(lengths) if lengths is not None
                  else metadata.query_start_loc[:prefills + 1].to("cpu", torch.int64))
        flags = mixed.has_initial_states
        calls += _prefill_calls(layer, cache, starts, lambda: metadata.mamba_cache_indices[:prefills].to(torch.int32),
                                lambda: flags[:prefills].clone())
    if decodes:
        slots = metadata.mamba_cache_indices
        calls += _decode_calls(layer, cache, decodes, lambda: slots[prefills:prefills + decodes].to(torch.int32))
    return calls


def _prefill_calls(layer: Any, cache: tuple[int, int, torch.dtype], starts: torch.Tensor,
                   slots: Callable[[], torch.Tensor], initial: Callable[[], torch.Tensor]) -> list[KernelCall]:
    conv_slots, ssm_slots, state_dtype = cache
    bias = layer.conv1d.bias is not None
    return [causal_conv1d.prefill_call(*_conv(layer), conv_slots, starts, slots, initial, bias),
            mamba.prefill_call(*_sizes(layer), ssm_slots, starts, slots, initial, state_dtype)]


def _decode_calls(layer: Any, cache: tuple[int, int, torch.dtype], decodes: int,
                  slots: Callable[[], torch.Tensor]) -> list[KernelCall]:
    conv_slots, ssm_slots, state_dtype = cache
    bias = layer.conv1d.bias is not None
    return [causal_conv1d.decode_call(*_conv(layer), conv_slots, decodes, slots, bias),
            mamba.decode_call(*_sizes(layer), ssm_slots, decodes, slots, state_dtype)]


def _mark(layer: Any) -> None:
    """The mixer, and its conv1d layer, whose weight it reads (its model never calls it)."""
    seen(layer)
    seen_weights(layer.conv1d.weight)


def _judged(layer: Any, hidden_states: torch.Tensor, metadata: Any, mup_vector: Optional[torch.Tensor],
            cache: tuple[int, int, torch.dtype]) -> None:
    _mark(layer)
    heads, _, _, groups = _sizes(layer)
    require(_step_problem(metadata, mup_vector) or judged_once(layer, lambda m: layer_problem(m, hidden_states.dtype)
                                                               or mamba.layer_problem(heads, groups, state_dtype=cache[2])))


def layer_calls(self: Any, hidden_states: torch.Tensor, layer_cache: Any, metadata: Any,
                mup_vector: Optional[torch.Tensor] = None) -> list[KernelCall]:
    """``MambaMixer2.forward``, eagerly: the step's conv1d and recurrence calls."""
    cache = _cache(layer_cache)
    _judged(self, hidden_states, metadata, mup_vector, cache)
    return _calls(self, cache, metadata)


def captured_layer_calls(self: Any, hidden_states: torch.Tensor, layer_cache: Any, metadata: Any,
                         mup_vector: Optional[torch.Tensor] = None) -> Callable[[], list[KernelCall]]:
    """While a CUDA graph captures the mixer: how to build its calls in each step that replays it,
    from that step's batch (its requests, their lengths) and the backend's metadata (their slots)."""
    cache = _cache(layer_cache)
    _judged(self, hidden_states, metadata, mup_vector, cache)
    return functools.partial(_calls_in_graph, self, cache)


def _calls_in_graph(layer: Any, cache: tuple[int, int, torch.dtype]) -> list[KernelCall]:
    batch, backend = STEP.context.get("batch"), linear_backend()
    if batch is None or backend is None:
        raise RuntimeError("a CUDA graph replayed outside a model step: its Mamba-2 layout is unknown")
    metadata = backend.forward_metadata
    _speculative(metadata)
    mode = batch.forward_mode
    if not (mode.is_decode() or mode.is_extend()):
        return []  # idle and dummy steps run no layer work
    slots_of = metadata.mamba_cache_indices
    if mode.is_decode():
        requests = int(batch.batch_size)
        return _decode_calls(layer, cache, requests, lambda: slots_of[:requests].to(torch.int32))
    starts, prefix = query_starts(batch.extend_seq_lens_cpu), batch.extend_prefix_lens
    requests = len(starts) - 1
    return _prefill_calls(layer, cache, starts, lambda: slots_of[:requests].to(torch.int32),
                          lambda: (prefix[:requests] > 0).clone())
