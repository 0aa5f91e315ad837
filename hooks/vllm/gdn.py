"""vLLM's Gated DeltaNet layers (``QwenGatedDeltaNetAttention``: Qwen3-Next, Qwen3.5): each
step's causal conv1d as a ``causal_conv1d_*`` call and its recurrence as ``gdn_decode_*`` and
``gdn_prefill_*`` calls, read from the layer's metadata in the forward context (its decode and
prefill request counts, the requests' state slots) and the step's host query starts.

The conv1d runs as the layer runs it: ``causal_conv1d_update`` over a step of one-token requests,
else ``causal_conv1d_fn`` over all of them, decode requests included; the recurrence runs on the
decode and the prefill requests apart.

Eagerly the layer's ``forward`` is hooked as it runs; in a compiled forward (where the core op is
opaque and runs no Python hook of ours) the hook, traced once, gives the calls to build in each
step from that step's metadata, as the attention layers do."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import judged_once, require, seen
from fi_profile.families import causal_conv1d, gdn
from fi_profile.hooks.vllm.recurrent_state import layer_metadata, query_starts, state_slots

#: the layer classes whose core op computes the gdn Definitions
COVERED_CLASSES = ("QwenGatedDeltaNetAttention",)


def _sizes(layer: Any) -> tuple[int, int, int, int]:
    """Key heads, value heads (per tensor-parallel rank), key and value head sizes."""
    ranks = int(getattr(layer, "tp_size", 1) or 1)
    return layer.num_k_heads // ranks, layer.num_v_heads // ranks, int(layer.head_k_dim), int(layer.head_v_dim)


def recurrence_problem(layer: Any, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the layer's recurrence is no gdn Definition's (its class, sizes; its activations' dtype
    where known: at a call), or None."""
    name = type(layer).__name__
    if name not in COVERED_CLASSES:
        return f"{name} (a Gated DeltaNet layer class no Definition computes)"
    return gdn.layer_problem(*_sizes(layer), dtype)


def conv_problem(layer: Any, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the layer's causal conv1d is no causal_conv1d Definition's, or None."""
    problem = causal_conv1d.layer_problem(getattr(layer, "activation", None), dtype)
    return f"{type(layer).__name__}'s {problem}" if problem else None


def layer_problem(layer: Any) -> Optional[str]:
    """What the record misses of the layer: its recurrence's problem, else its conv1d's."""
    return recurrence_problem(layer) or conv_problem(layer)


def _problem(layer: Any, dtype: torch.dtype) -> Optional[str]:
    return recurrence_problem(layer, dtype) or conv_problem(layer, dtype)


def _prefill_starts(metadata: Any) -> Optional[torch.Tensor]:
    """The prefill requests' query starts from 0, on the host (None: the step has none)."""
    decodes, prefills = int(metadata.num_decodes), int(metadata.num_prefills)
    if not prefills:
        return None
    starts = query_starts(metadata, decodes, prefills)
    if int(starts[-1]) != int(metadata.num_prefill_tokens):
        raise RuntimeError(f"the step's prefill query starts sum to {int(starts[-1])} tokens, its Gated DeltaNet "
                           f"metadata says {int(metadata.num_prefill_tokens)}")
    return starts


def _calls(layer: Any) -> list[KernelCall]:
    metadata = layer_metadata(layer.prefix)
    if metadata is None or not getattr(metadata, "num_actual_tokens", 0):  # profiling / dummy run
        return []
    if getattr(metadata, "num_spec_decodes", 0):
        raise NotImplementedError("Gated DeltaNet's speculative (multi-token) decode steps: gdn_mtp_* is not "
                                  "captured yet")
    heads, v_heads, _, _ = _sizes(layer)
    decodes = int(metadata.num_decodes)
    return [_conv_call(layer, metadata, decodes),
            *gdn.step_calls(heads, v_heads, decodes, _prefill_starts(metadata))]


def _conv_call(layer: Any, metadata: Any, decodes: int) -> KernelCall:
    """The step's conv1d: over its decode requests where it has no prefill, else over all of them.
    The slots and initial-state flags stay on the device: gathered for a kept workload only."""
    ranks = int(getattr(layer, "tp_size", 1) or 1)
    sizes = (int(layer.conv_dim) // ranks, int(layer.conv_kernel_size), str(layer.activation), state_slots(layer))
    slots, bias = metadata.non_spec_state_indices_tensor, getattr(layer.conv1d, "bias", None) is not None
    if not int(metadata.num_prefills):
        return causal_conv1d.decode_call(*sizes, decodes, lambda: slots[:decodes].to(torch.int32), bias)
    requests = decodes + int(metadata.num_prefills)
    flags = metadata.has_initial_state
    return causal_conv1d.prefill_call(*sizes, query_starts(metadata, 0, requests),
                                      lambda: slots[:requests].to(torch.int32), lambda: flags[:requests].clone(), bias)


def layer_calls(self: Any, hidden_states: torch.Tensor) -> list[KernelCall]:
    """``QwenGatedDeltaNetAttention.forward``, eagerly: the step's calls of its recurrence."""
    seen(self)
    require(judged_once(self, lambda layer: _problem(layer, hidden_states.dtype)))
    return _calls(self)


def traced_layer_calls(self: Any, hidden_states: torch.Tensor) -> Callable[[], list[KernelCall]]:
    """While torch.compile traces the layer: how to build its calls in each step."""
    seen(self)
    require(_problem(self, hidden_states.dtype))
    return functools.partial(_calls, self)
