"""Achieved throughput beside a time: TFLOP/s from the op family's FLOP count for a workload, and
its share of the card's dense peak for the operands' precision, so that a user sees how far from
the roof a kernel is.

Peaks are NVIDIA's spec-sheet figures without sparsity (the sheets print twice these "with
sparsity"); a card not listed, or a precision it has no figure for, gets no share."""

from __future__ import annotations

from typing import Mapping, Optional

from fi_profile.families import family_of
from fi_profile.schema import Definition
from fi_profile.schema.dtype import DType

#: (a word of the card's name as torch reports it, dense tensor-core TFLOP/s per operand precision),
#: the first that the name holds applies (the NVL and PCIe cards before their SXM namesakes)
PEAK_TFLOPS: tuple[tuple[str, Mapping[str, float]], ...] = (
    ("H200 NVL", {"bf16": 835.5, "fp8": 1670.5}),
    ("H200", {"bf16": 989.5, "fp8": 1979.0}),
    ("H100 NVL", {"bf16": 835.5, "fp8": 1670.5}),
    ("H100 PCIe", {"bf16": 756.5, "fp8": 1513.0}),
    ("H100", {"bf16": 989.5, "fp8": 1979.0}),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("A100", {"bf16": 312.0}),
)

_FP8 = (DType.float8_e4m3fn, DType.float8_e5m2)
_HALF = (DType.bfloat16, DType.float16)


def precision(definition: Definition) -> Optional[str]:
    """The tensor-core precision the Definition's operands call for: "fp8" where an input is FP8,
    "bf16" where one is bfloat16 or float16 (the same peak), else None."""
    dtypes = {spec.dtype for spec in definition.inputs.values()}
    if dtypes & set(_FP8):
        return "fp8"
    return "bf16" if dtypes & set(_HALF) else None


def tflops(definition: Definition, axes: Mapping[str, int], ms: float) -> Optional[float]:
    """TFLOP/s of one call of the workload with var ``axes`` that took ``ms``; None where the family
    counts no FLOPs for it."""
    family = family_of(definition.op_type)
    if family is None or ms <= 0:
        return None
    flops = family.flops(definition, definition.axis_values(dict(axes)))
    return None if flops is None else flops / (ms * 1e-3) / 1e12


def peak(device_name: str, definition: Definition) -> Optional[float]:
    """The card's dense peak TFLOP/s for the Definition's precision, or None where unknown."""
    wanted = precision(definition)
    for word, peaks in PEAK_TFLOPS:
        if word in device_name:
            return peaks.get(wanted) if wanted else None
    return None
