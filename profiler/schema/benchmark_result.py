"""Benchmark Result (seed 001): one candidate kernel timed on one device.

Two forms: a compiled kernel carries ``time`` (milliseconds), ``speedup`` and ``max_diff``; a
kernel that failed to build carries ``compile_error`` and none of those.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field, NonNegativeFloat, model_validator

from profiler.errors import FieldErrors, Loc
from profiler.schema.base import StrictModel


class Device(StrictModel):
    name: str = Field(min_length=1)


class BenchmarkResult(StrictModel):
    device: Device
    kernel_id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    compiled: bool
    time: Optional[NonNegativeFloat] = None
    speedup: Optional[NonNegativeFloat] = None
    max_diff: Optional[NonNegativeFloat] = None
    compile_error: Optional[str] = None

    @model_validator(mode="after")
    def _form_matches_compiled(self) -> "BenchmarkResult":
        errors: list[tuple[Loc, str]] = []
        measured = {"time": self.time, "speedup": self.speedup, "max_diff": self.max_diff}
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
