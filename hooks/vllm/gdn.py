"""vLLM's Gated DeltaNet layers (``QwenGatedDeltaNetAttention``: Qwen3-Next, Qwen3.5): each
step's recurrence as ``gdn_decode_*`` and ``gdn_prefill_*`` calls, read from the layer's metadata
in the forward context (its decode and prefill request counts) and the step's host query starts.

Eagerly the layer's ``forward`` is hooked as it runs; in a compiled forward (where the core op is
opaque and runs no Python hook of ours) the hook, traced once, gives the calls to build in each
step from that step's metadata, as the attention layers do."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import judged_once, require, seen
from fi_profile.families import gdn
from fi_profile.hooks.vllm.attention import STEP

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


def layer_problem(layer: Any) -> str:
    """What the record misses of the layer: its recurrence's problem, else its causal conv1d (the
    recurrence is recorded, the conv1d before it is no Definition's yet)."""
    return recurrence_problem(layer) or (
        f"{type(layer).__name__}'s causal conv1d before its recurrence (no Definition computes it; the recurrence "
        "is recorded as gdn_*)")


def _metadata(prefix: str) -> Any:
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # micro-batches: the first one's
        metadata = metadata[0]
    if isinstance(metadata, dict):
        metadata = metadata.get(prefix)
    return metadata


def _prefill_starts(metadata: Any) -> Optional[torch.Tensor]:
    """The prefill requests' query starts from 0, on the host: the step's common metadata's CPU copy
    (the decode requests come first), else the layer's own (a device copy on a GPU)."""
    decodes, prefills = int(metadata.num_decodes), int(metadata.num_prefills)
    if not prefills:
        return None
    common = STEP.context.get("common")
    source = getattr(common, "query_start_loc_cpu", None)
    if source is None:
        source = metadata.non_spec_query_start_loc.cpu()
    starts = source[decodes:decodes + prefills + 1].to(torch.int64)
    starts = starts - starts[0]
    if int(starts[-1]) != int(metadata.num_prefill_tokens):
        raise RuntimeError(f"the step's prefill query starts sum to {int(starts[-1])} tokens, its Gated DeltaNet "
                           f"metadata says {int(metadata.num_prefill_tokens)}")
    return starts


def _calls(sizes: tuple[int, int, int, int], prefix: str) -> list[KernelCall]:
    metadata = _metadata(prefix)
    if metadata is None or not getattr(metadata, "num_actual_tokens", 0):  # profiling / dummy run
        return []
    if getattr(metadata, "num_spec_decodes", 0):
        raise NotImplementedError("Gated DeltaNet's speculative (multi-token) decode steps: gdn_mtp_* is not "
                                  "captured yet")
    heads, v_heads, _, _ = sizes
    return gdn.step_calls(heads, v_heads, int(metadata.num_decodes), _prefill_starts(metadata))


def layer_calls(self: Any, hidden_states: torch.Tensor) -> list[KernelCall]:
    """``QwenGatedDeltaNetAttention.forward``, eagerly: the step's calls of its recurrence."""
    seen(self)
    require(judged_once(self, lambda layer: recurrence_problem(layer, hidden_states.dtype)))
    return _calls(_sizes(self), self.prefix)


def traced_layer_calls(self: Any, hidden_states: torch.Tensor) -> Callable[[], list[KernelCall]]:
    """While torch.compile traces the layer: how to build its calls in each step."""
    seen(self)
    require(recurrence_problem(self, hidden_states.dtype))
    return functools.partial(_calls, _sizes(self), self.prefix)
