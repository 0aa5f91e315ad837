"""Workloads and trace lines, as flashinfer-trace stores them in ``workloads/{op_type}/{name}.jsonl``.

A line is a Trace: ``definition``, ``solution``, ``workload`` and ``evaluation``; a bare workload
has ``solution`` and ``evaluation`` null. A workload binds every var axis of its Definition and
says where each input comes from: ``random`` (synthesised), ``scalar`` (a value) or
``safetensors`` (a captured tensor, path relative to the dataset root). ``count`` is fi-profile's
addition: how many times the captured run made this call.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal, Optional, Union

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator

from fi_profile.errors import FieldErrors, Loc
from fi_profile.schema.base import StrictModel
from fi_profile.schema.definition import Definition


class RandomInput(StrictModel):
    type: Literal["random"] = "random"


class ScalarInput(StrictModel):
    type: Literal["scalar"] = "scalar"
    value: Union[bool, int, float]


class SafetensorsInput(StrictModel):
    type: Literal["safetensors"] = "safetensors"
    path: str = Field(min_length=1)
    tensor_key: str = Field(min_length=1)


InputSpec = Annotated[Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")]


class Workload(StrictModel):
    uuid: str = Field(min_length=1)
    axes: dict[str, NonNegativeInt]
    inputs: dict[str, InputSpec]
    count: Optional[PositiveInt] = None

    def problems_against(self, definition: Definition) -> list[tuple[Loc, str]]:
        """What does not fit the Definition this workload names."""
        errors: list[tuple[Loc, str]] = []
        for name in self.axes:
            if name not in definition.axes:
                errors.append((("axes", name), f"{definition.name} has no axis {name!r}"))
            elif name in definition.const_axes:
                errors.append((("axes", name), "is a const axis; workloads bind var axes only"))
        for name in definition.var_axes:
            if name not in self.axes:
                errors.append((("axes",), f"var axis {name!r} has no value"))
        for name, source in self.inputs.items():
            spec = definition.inputs.get(name)
            if spec is None:
                errors.append((("inputs", name), f"{definition.name} has no input {name!r}"))
            elif isinstance(source, ScalarInput) and spec.shape not in (None, []):
                errors.append((("inputs", name), "a scalar source for a tensor input"))
        for name, spec in definition.inputs.items():
            if name not in self.inputs and not spec.optional:
                errors.append((("inputs",), f"input {name!r} has no source"))
        return errors


class EvaluationStatus(str, Enum):
    passed = "PASSED"
    incorrect_shape = "INCORRECT_SHAPE"
    incorrect_numerical = "INCORRECT_NUMERICAL"
    incorrect_dtype = "INCORRECT_DTYPE"
    runtime_error = "RUNTIME_ERROR"
    compile_error = "COMPILE_ERROR"
    timeout = "TIMEOUT"


class Correctness(StrictModel):
    max_relative_error: NonNegativeFloat
    max_absolute_error: NonNegativeFloat


class Performance(StrictModel):
    latency_ms: NonNegativeFloat
    reference_latency_ms: NonNegativeFloat
    speedup_factor: NonNegativeFloat


class Environment(StrictModel):
    hardware: str
    libs: dict[str, str]


class Evaluation(StrictModel):
    status: EvaluationStatus
    log: str
    correctness: Optional[Correctness] = None
    performance: Optional[Performance] = None
    environment: Environment
    timestamp: str

    @model_validator(mode="after")
    def _nullable_by_status(self) -> "Evaluation":
        needs_correctness = self.status in (EvaluationStatus.passed, EvaluationStatus.incorrect_numerical)
        needs_performance = self.status is EvaluationStatus.passed
        errors: list[tuple[Loc, str]] = []
        for field, needed, value in (
            ("correctness", needs_correctness, self.correctness),
            ("performance", needs_performance, self.performance),
        ):
            if needed and value is None:
                errors.append(((field,), f"required when status is {self.status.value}"))
            if not needed and value is not None:
                errors.append(((field,), f"must be null when status is {self.status.value}"))
        if errors:
            raise FieldErrors(errors)
        return self


class Trace(StrictModel):
    """One line of a workloads/traces JSONL file."""

    definition: str = Field(min_length=1)
    solution: Optional[str] = None
    workload: Workload
    evaluation: Optional[Evaluation] = None
