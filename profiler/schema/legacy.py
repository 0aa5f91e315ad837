"""The older seed-001 kernel description, read and converted to a seed-002 Definition.

Differences from a Definition: ``id`` (or ``name``) instead of ``name``; ``reference_code`` (or
``code``) instead of ``reference``; ``assumptions`` instead of ``constraints``; no ``op_type``;
``dtype`` optional with default ``float16``; ``float8_e4m3`` spelling; ``[]`` shape = scalar.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import AliasChoices, BeforeValidator, Field, PrivateAttr, ValidationError, model_validator

from fi_profile.errors import FieldErrors, Loc, problems_from_validation_error
from fi_profile.schema.base import StrictModel
from fi_profile.schema.definition import Axis, AxisConst, AxisVar, Definition, TensorSpec
from fi_profile.schema.dtype import DType, parse_dtype

#: op types recognised in a legacy id, most specific first.
_KNOWN_OP_TYPES = (
    "fused_add_rmsnorm",
    "rmsnorm",
    "grouped_gemm",
    "gemm",
    "gqa_paged",
    "gqa_ragged",
    "mla_paged",
    "mla_ragged",
    "attention",
    "rope",
    "sampling",
    "moe",
)


class LegacyTensorSpec(StrictModel):
    shape: list[str]
    dtype: Annotated[DType, BeforeValidator(parse_dtype)] = DType.float16


class LegacyKernelDescription(StrictModel):
    id: str = Field(min_length=1, validation_alias=AliasChoices("id", "name"))
    axes: dict[str, Axis]
    inputs: dict[str, LegacyTensorSpec]
    outputs: dict[str, LegacyTensorSpec]
    reference_code: str = Field(validation_alias=AliasChoices("reference_code", "code"))
    assumptions: Optional[list[str]] = None
    _definition: Optional[Definition] = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _converts(cls, data: Any, handler: Any) -> "LegacyKernelDescription":
        """One spelling of each field; and the description must convert to a valid Definition,
        whose problems are reported under the fields of this file (``reference_code`` or
        ``code``, ``assumptions``, ``id`` or ``name``)."""
        spelled: dict[str, str] = {}
        if isinstance(data, dict):
            for a, b in (("id", "name"), ("reference_code", "code")):
                if a in data and b in data:
                    raise ValueError(f"give either {a!r} or {b!r}, not both")
                spelled[a] = b if b in data else a
        model = handler(data)
        try:
            model._definition = model.to_definition()
        except ValidationError as exc:
            ours = {"name": spelled.get("id", "id"), "reference": spelled.get("reference_code", "reference_code"),
                    "constraints": "assumptions"}
            errors: list[tuple[Loc, str]] = []
            for problem in problems_from_validation_error("", exc):
                head, _, rest = problem.path.partition(".")
                loc: Loc = tuple(p for p in (ours.get(head, head), rest) if p)
                errors.append((loc, problem.message))
            raise FieldErrors(errors) from None
        return model

    def op_type(self) -> str:
        lowered = self.id.lower()
        for op_type in _KNOWN_OP_TYPES:
            if op_type in lowered:
                return op_type
        return "legacy"

    def to_definition(self) -> Definition:
        """Convert to a seed-002 Definition (validated like any other)."""
        if self._definition is not None:
            return self._definition

        def convert(spec: LegacyTensorSpec) -> TensorSpec:
            return TensorSpec(shape=spec.shape or None, dtype=spec.dtype)

        axes: dict[str, AxisConst | AxisVar] = dict(self.axes)
        return Definition(
            name=self.id,
            op_type=self.op_type(),
            description="Converted from a seed-001 kernel description.",
            axes=axes,
            inputs={n: convert(s) for n, s in self.inputs.items()},
            outputs={n: convert(s) for n, s in self.outputs.items()},
            reference=self.reference_code,
            constraints=self.assumptions,
        )
