"""The op families: each one package that holds everything of its op (see README, "Adding an op
family"): what its calls are and how each becomes a Definition with its var axes, how the
engines' layers of it are judged and read (where both engines' layers are alike), its template
Definitions, its PyTorch baselines and the engines' native kernels as Solution sources, how its
outputs are checked, and which kernel an engine runs for it. Each engine's hook points for it are
in the engine's folder (``hooks/<engine>/hook_points.py``), under the family's key.

Adding a family: its package, its templates under ``definitions/{op_type}/``, and one line below.
"""

from __future__ import annotations

from typing import Optional

from fi_profile.families import (
    attention,
    bmm,
    causal_conv1d,
    collective,
    dsa,
    embedding,
    fp8_linear,
    gdn,
    gemm,
    kv_cache,
    mamba,
    mla,
    moe,
    qk_norm_rope,
    qk_rmsnorm,
    rmsnorm,
    rope,
    sampling,
    shared_expert_gate,
    sigmoid_gate_mul,
    silu_and_mul,
)
from fi_profile.families.family import Family

FAMILIES: tuple[Family, ...] = (
    rmsnorm.FAMILY,
    qk_rmsnorm.FAMILY,
    silu_and_mul.FAMILY,
    gemm.FAMILY,
    fp8_linear.FAMILY,
    embedding.FAMILY,
    rope.FAMILY,
    qk_norm_rope.FAMILY,
    kv_cache.FAMILY,
    attention.FAMILY,
    mla.FAMILY,
    dsa.FAMILY,
    causal_conv1d.FAMILY,
    gdn.FAMILY,
    mamba.FAMILY,
    bmm.FAMILY,
    moe.FAMILY,
    shared_expert_gate.FAMILY,
    sigmoid_gate_mul.FAMILY,
    sampling.FAMILY,
    collective.FAMILY,
)

_BY_OP_TYPE = {op_type: family for family in FAMILIES for op_type in family.op_types}

#: op type -> the words its engine kernels are named with (the capture's kernel accounting)
KERNEL_WORDS: dict[str, tuple[str, ...]] = {op_type: family.op_kernel_words.get(op_type, family.kernel_words)
                                            for family in FAMILIES for op_type in family.op_types}

#: what the kernel accounting reads of the families' kernel names (its ``attribute``'s keywords)
KERNEL_NAMING: dict[str, object] = {
    "kernel_words": KERNEL_WORDS,
    "tail_words": {op_type: family.tail_words for family in FAMILIES for op_type in family.op_types if family.tail_words},
    "head_words": {op_type: family.head_words for family in FAMILIES for op_type in family.op_types if family.head_words},
    "continue_words": {op_type: family.continue_words for family in FAMILIES for op_type in family.op_types
                       if family.continue_words},
    "reducing": frozenset(op_type for family in FAMILIES if family.reduces for op_type in family.op_types),
    "launches": {op_type: frozenset(t for other in FAMILIES if other.key in family.launches for t in other.op_types)
                 for family in FAMILIES for op_type in family.op_types if family.launches},
    "family_op_types": {family.key: frozenset(family.op_types) for family in FAMILIES},
}


def family_of(op_type: str) -> Optional[Family]:
    """The family that owns Definitions of ``op_type`` (None: one no family knows, a dataset's)."""
    return _BY_OP_TYPE.get(op_type)
