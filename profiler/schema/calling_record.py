"""Kernel Calling Record (seed 001): which kernels one model run called, and how often."""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import Field, NonNegativeInt, model_validator

from fi_profile.errors import FieldErrors
from fi_profile.schema.base import StrictModel
from fi_profile.schema.run_info import RunInfo


class Framework(str, Enum):
    sglang = "SGLang"
    vllm = "vLLM"
    mlc_llm = "MLC-LLM"
    trt_llm = "TRT-LLM"


class KernelCount(StrictModel):
    id: str = Field(min_length=1)
    count: NonNegativeInt


class KernelCallingRecord(StrictModel):
    model: str = Field(min_length=1)
    framework: Framework
    kernels: list[KernelCount]
    #: fi-profile's addition: how the run was made (engine, eager or graphs, dummy weights,
    #: scenario, hook status) and what the record misses. Readers of the seed format can ignore it.
    run: Optional[RunInfo] = None

    @model_validator(mode="after")
    def _unique_ids(self) -> "KernelCallingRecord":
        seen: dict[str, int] = {}
        errors = []
        for i, kernel in enumerate(self.kernels):
            if kernel.id in seen:
                errors.append((("kernels", i, "id"), f"{kernel.id!r} already listed at kernels.{seen[kernel.id]}"))
            seen.setdefault(kernel.id, i)
        if errors:
            raise FieldErrors(errors)
        return self

    def counts(self) -> dict[str, int]:
        return {k.id: k.count for k in self.kernels}
