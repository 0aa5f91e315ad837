"""A kernel-level call in canonical form: the Definition it matches and its var-axis values.

Each op family (:mod:`fi_profile.families`) builds these from a hooked call; this module holds
what they share: the call itself, the per-process cache of Definitions by a cheap key of the
call's constants, and the naming helpers every family's Definition names use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType


@dataclass
class KernelCall:
    definition: Definition
    axes: dict[str, int]
    #: index tensors (indptr, indices, last-page lengths) worth keeping for replay
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)


_DEFINITIONS: dict[tuple, Definition] = {}


def cached_definition(key: tuple, build: Callable[[], Definition]) -> Definition:
    """Definitions by a cheap key of the call's constants: the hot path is one dict lookup."""
    definition = _DEFINITIONS.get(key)
    if definition is None:
        definition = _DEFINITIONS[key] = build()
    return definition


def dtype_suffix(dtype: DType) -> str:
    """A Definition name's dtype suffix: none for bfloat16 (the templates' dtype), else ``_{dtype}``."""
    return "" if dtype is DType.bfloat16 else f"_{dtype.value}"


#: dtype names as flashinfer-trace writes them in Definition names (``moe_fp8_block_scale_*``)
SHORT_DTYPES = {DType.bfloat16: "bf16", DType.float16: "fp16", DType.float32: "fp32"}


def rows(x: torch.Tensor, width: int) -> int:
    """Rows of ``width`` elements in ``x`` (tokens, for an activation of that hidden width)."""
    return x.numel() // width if width else 0
