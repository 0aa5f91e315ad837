"""Benchmark Result (seed 001): one candidate kernel timed on one device.

Two forms: a compiled kernel carries ``time`` (milliseconds), ``speedup`` and ``max_diff``; a
kernel that failed to build carries ``compile_error`` and none of those.

Replay writes the same document with more fields (all optional, so the seed's examples stay
valid): which workload and solution, a ``status`` (a compiled kernel can still fail at run time,
be wrong or time out; then ``time`` and ``speedup`` are absent), the correctness statistics, the
timing statistics and the environment. With ``status``, ``kernel_id`` is the Definition and
``source`` the solution.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import Field, NonNegativeFloat, model_validator

from fi_profile.errors import FieldErrors, Loc
from fi_profile.schema.base import StrictModel


class Device(StrictModel):
    name: str = Field(min_length=1)
    sm_clock_mhz: Optional[int] = None
    max_sm_clock_mhz: Optional[int] = None


class Status(str, Enum):
    passed = "passed"
    incorrect_shape = "incorrect_shape"
    incorrect_dtype = "incorrect_dtype"
    incorrect_numerical = "incorrect_numerical"
    mutates_input = "mutates_input"
    stale_output = "stale_output"  # an output that does not follow its input (cached, or not written)
    runtime_error = "runtime_error"
    timeout = "timeout"
    crashed = "crashed"  # the worker process died
    compile_error = "compile_error"


class Check(StrictModel):
    """Against the reference, over every draw of the inputs."""

    max_abs_diff: NonNegativeFloat
    max_rel_diff: NonNegativeFloat
    mismatch_ratio: float = Field(ge=0, le=1)
    atol: NonNegativeFloat
    rtol: NonNegativeFloat
    draws: int = Field(ge=1)
    method: str = "allclose"  # or "distribution" (sampling), "exact" (integers), "sets" (a top-k's indices per row)
    #: the Definition's outputs the solution does not compute (its ``spec.computes``): not checked
    unchecked: list[str] = Field(default_factory=list)


class Timing(StrictModel):
    method: str  # cuda_events, cupti_kernels, cuda_graph, cuda_graph_cupti_kernels, cpu_wall
    repetitions: int = Field(ge=1)
    median_ms: NonNegativeFloat
    p10_ms: NonNegativeFloat
    p90_ms: NonNegativeFloat
    cv: NonNegativeFloat
    cold_l2: bool
    #: device time spun before each timed call so the host's enqueueing is not timed (CUDA)
    host_lead_us: NonNegativeFloat = 0.0
    #: the call's per-step inputs (activations, not weights or KV cache) read back into the L2 after the flush
    warm_inputs: bool = False
    #: the GPU's SM clock over the timed calls (NVML, sampled), and the share of the samples with the
    #: clock held down for power or heat (CUDA, where NVML answers)
    sm_clock_mhz: Optional[NonNegativeFloat] = None
    clock_limited_share: Optional[float] = Field(default=None, ge=0, le=1)
    #: what ended the timed loop ("precision", "time cap", "repetitions cap"), and the median's
    #: estimated relative standard error then (replay/stopping.py)
    stopped_by: Optional[str] = None
    median_rel_error: Optional[NonNegativeFloat] = None


class BenchmarkResult(StrictModel):
    device: Device
    kernel_id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    compiled: bool
    time: Optional[NonNegativeFloat] = None
    speedup: Optional[NonNegativeFloat] = None
    max_diff: Optional[NonNegativeFloat] = None
    compile_error: Optional[str] = None
    # replay's fields
    workload: Optional[str] = None
    definition_op_type: Optional[str] = None
    status: Optional[Status] = None
    error: Optional[str] = None
    check: Optional[Check] = None
    timing: Optional[Timing] = None
    reference_time: Optional[NonNegativeFloat] = None
    baseline: Optional[str] = None
    baseline_speedup: Optional[NonNegativeFloat] = None
    libs: dict[str, str] = Field(default_factory=dict)
    language: Optional[str] = None

    @model_validator(mode="after")
    def _form_matches_compiled(self) -> "BenchmarkResult":
        errors: list[tuple[Loc, str]] = []
        measured = {"time": self.time, "speedup": self.speedup, "max_diff": self.max_diff}
        if self.status is not None and self.status is not Status.passed:
            if self.status is Status.compile_error and (self.compiled or self.compile_error is None):
                errors.append((("compile_error",), "status compile_error needs compiled false and a compile_error"))
            for f in ("time", "speedup"):
                if measured[f] is not None:
                    errors.append(((f,), f"must be absent when status is {self.status.value}"))
            if errors:
                raise FieldErrors(errors)
            return self
        if self.compiled:
            errors += [((f,), "required when compiled is true") for f, v in measured.items() if v is None]
            if self.compile_error is not None:
                errors.append((("compile_error",), "must be absent when compiled is true"))
        else:
            if self.compile_error is None:
                errors.append((("compile_error",), "required when compiled is false"))
            errors += [((f,), "must be absent when compiled is false") for f, v in measured.items() if v is not None]
        if errors:
            raise FieldErrors(errors)
        return self
