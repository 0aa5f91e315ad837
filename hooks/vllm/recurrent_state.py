"""What vLLM's recurrent layers (Gated DeltaNet, Mamba) hold of a step, read alike by their hooks:
their state caches (conv and recurrence), their metadata in the forward context, and the step's
host query starts."""

from __future__ import annotations

from typing import Any

import torch

from fi_profile.hooks.vllm.attention import STEP


def state_cache(layer: Any, which: int = 0) -> torch.Tensor:
    """A Gated DeltaNet or Mamba layer's state cache ``which`` (0: the conv state, 1: the
    recurrence's): vLLM binds the layer's (conv, ssm) states, or (0.26's Gated DeltaNet) a list of
    them per virtual engine."""
    states = layer.kv_cache
    if not isinstance(states[0], torch.Tensor):
        states = states[0]
    return states[which]


def state_slots(layer: Any, which: int = 0) -> int:
    """The slots of the layer's state cache ``which``: its first dimension, whatever the layout."""
    return int(state_cache(layer, which).shape[0])


def layer_metadata(prefix: str) -> Any:
    """The layer's metadata of this step from the forward context (None: a profiling or dummy run)."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # micro-batches: the first one's
        metadata = metadata[0]
    if isinstance(metadata, dict):
        metadata = metadata.get(prefix)
    return metadata


def query_starts(metadata: Any, first: int, count: int) -> torch.Tensor:
    """Requests ``first`` to ``first + count``'s query starts from 0, on the host: the step's common
    metadata's CPU copy (decode requests come first), else the layer's own (a device copy on a GPU)."""
    common = STEP.context.get("common")
    source = getattr(common, "query_start_loc_cpu", None)
    if source is None:
        own = getattr(metadata, "non_spec_query_start_loc", None)  # Gated DeltaNet's: all its requests
        if own is None:
            raise RuntimeError(f"the step's query starts are not known: no attention metadata builder ran this step, "
                               f"and {type(metadata).__name__} holds none of all its requests")
        source = own.cpu()
    starts = source[first:first + count + 1].to(torch.int64)
    return starts - starts[0]
