"""Kernel Definition (seed 002): what a kernel computes, its axes, tensors and reference."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BeforeValidator, Field, NonNegativeInt, model_validator

from fi_profile.errors import FieldErrors, Loc
from fi_profile.schema.base import StrictModel
from fi_profile.schema.constraint import Constraint, ConstraintError
from fi_profile.schema.dtype import DType, parse_dtype
from fi_profile.schema.reference import entry_signature
from fi_profile.schema.solution import overwrite_problems


class AxisConst(StrictModel):
    type: Literal["const"]
    value: NonNegativeInt
    description: Optional[str] = None


class AxisVar(StrictModel):
    type: Literal["var"]
    parent: Optional[str] = None
    description: Optional[str] = None


Axis = Annotated[Union[AxisConst, AxisVar], Field(discriminator="type")]


class TensorSpec(StrictModel):
    """``shape`` lists axis names; ``[]`` is a 0-D tensor, ``None`` a Python scalar."""

    shape: Optional[list[str]]
    dtype: Annotated[DType, BeforeValidator(parse_dtype)]
    description: Optional[str] = None
    optional: bool = False

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


class Definition(StrictModel):
    name: str = Field(min_length=1)
    op_type: str = Field(min_length=1)
    tags: Optional[list[str]] = None
    description: Optional[str] = None
    axes: dict[str, Axis]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str
    constraints: Optional[list[str]] = None
    #: where the engine's kernel works in place: each input it overwrites, with the output it holds
    #: afterwards (null: scratch). The reference still returns every output; Solutions that work in
    #: place say so themselves (``spec.overwrites``), so this is what a native kernel is held to.
    overwrites: Optional[dict[str, Optional[str]]] = None

    @model_validator(mode="before")
    @classmethod
    def _accept_type_alias(cls, data: Any) -> Any:
        # Seed 002's RMSNorm example spells op_type as "type"; accept it when op_type is absent.
        if isinstance(data, dict) and "op_type" not in data and isinstance(data.get("type"), str):
            data = dict(data)
            data["op_type"] = data.pop("type")
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> "Definition":
        errors: list[tuple[Loc, str]] = []
        for name, axis in self.axes.items():
            if isinstance(axis, AxisVar) and axis.parent is not None:
                if axis.parent not in self.axes:
                    errors.append((("axes", name, "parent"), f"unknown axis {axis.parent!r}"))
                elif axis.parent == name:
                    errors.append((("axes", name, "parent"), "an axis cannot be its own parent"))
        for group, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            for tname, spec in tensors.items():
                for i, axis_name in enumerate(spec.shape or []):
                    if axis_name not in self.axes:
                        errors.append(((group, tname, "shape", i), f"unknown axis {axis_name!r}"))
        for clash in sorted(set(self.inputs) & set(self.outputs)):
            errors.append((("outputs", clash), f"{clash!r} is also an input name"))
        for clash in sorted(set(self.axes) & (set(self.inputs) | set(self.outputs))):
            errors.append((("axes", clash), f"{clash!r} is also a tensor name"))
        errors.extend(self._check_reference())
        errors.extend(self._check_constraints())
        errors.extend(overwrite_problems(self.overwrites, self, ("overwrites",)))
        if errors:
            raise FieldErrors(errors)
        return self

    def _check_reference(self) -> list[tuple[Loc, str]]:
        """``run`` takes the inputs and returns the outputs (seed 002), or takes the inputs then
        the pre-allocated outputs and fills them (seed 001's code schema)."""
        try:
            signature = entry_signature(self.reference)
        except ValueError as exc:
            return [(("reference",), str(exc))]
        inputs, outputs = list(self.inputs), list(self.outputs)
        if signature.accepts(inputs) and not self.reference_destination_passing:
            return []
        if signature.accepts(inputs + outputs):
            scalars = [n for n, spec in self.outputs.items() if spec.is_scalar]
            if scalars:
                return [(("reference",), f"run{signature.params} fills its outputs in place, but "
                         f"{', '.join(scalars)} is a Python scalar (shape null) that cannot be pre-allocated")]
            return []
        return [
            (
                ("reference",),
                f"run{signature.params} takes neither the inputs {tuple(inputs)} (returning the outputs) "
                f"nor the inputs then the outputs {tuple(inputs + outputs)} (filling them), by name",
            )
        ]

    @cached_property
    def reference_destination_passing(self) -> bool:
        """Whether the reference's ``run`` takes the outputs (pre-allocated) after the inputs."""
        params = set(entry_signature(self.reference).params)
        return bool(self.outputs) and set(self.outputs) <= params

    def _check_constraints(self) -> list[tuple[Loc, str]]:
        errors: list[tuple[Loc, str]] = []
        known = set(self.axes) | set(self.inputs) | set(self.outputs)
        for i, source in enumerate(self.constraints or []):
            try:
                unknown = Constraint.parse(source).names() - known
            except ConstraintError as exc:
                errors.append((("constraints", i), str(exc)))
                continue
            if unknown:
                errors.append((("constraints", i), f"unknown names {sorted(unknown)}"))
        return errors

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict without empty optional fields, but with ``shape: null`` kept
        (a null shape means a Python scalar, so dropping it would change the Definition)."""
        data = self.model_dump(mode="json", exclude_none=True)
        for group in ("inputs", "outputs"):
            for name, spec in getattr(self, group).items():
                data[group][name].setdefault("shape", spec.shape)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    # ---- derived views -------------------------------------------------------------------------

    @cached_property
    def const_axes(self) -> dict[str, int]:
        return {n: a.value for n, a in self.axes.items() if isinstance(a, AxisConst)}

    @cached_property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if isinstance(a, AxisVar)]

    @cached_property
    def parsed_constraints(self) -> list[Constraint]:
        return [Constraint.parse(c) for c in self.constraints or []]

    def axis_values(self, var_values: dict[str, int]) -> dict[str, int]:
        """All axis values: the constants plus the given var values."""
        return {**self.const_axes, **var_values}

    def shape_of(self, spec: TensorSpec, axis_values: dict[str, int]) -> Optional[tuple[int, ...]]:
        """Concrete (logical) shape of a tensor spec; None for a Python scalar."""
        if spec.shape is None:
            return None
        return tuple(axis_values[a] for a in spec.shape)
