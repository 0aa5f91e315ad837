"""Where SGLang keeps a hybrid model's recurrent states in a step: its linear-attention backend
(the Gated DeltaNet and Mamba-2 layers' ``forward_metadata``, their state slots and pool)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from fi_profile.hooks.sglang.attention import STEP


def linear_backend() -> Any:
    """The step's linear-attention backend (the hybrid backend's), None where no runner is known."""
    runner = STEP.context.get("runner")
    if runner is None:
        return None
    backend = getattr(runner, "attn_backend", None)
    return getattr(backend, "linear_attn_backend", backend)


def query_starts(lengths: Sequence[int]) -> torch.Tensor:
    """The requests' query starts from 0 (``cu_seqlens``, int64 on the host) from their host lengths."""
    return torch.as_tensor([0, *lengths], dtype=torch.int64).cumsum(0)
