"""Match concrete tensors to a Definition: check const axes and dtypes, bind var axes."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from fi_profile.schema.constraint import ConstraintError
from fi_profile.schema.definition import Definition, TensorSpec
from fi_profile.schema.dtype import torch_dtype


class BindingError(ValueError):
    """The tensors do not fit the Definition."""


def logical_shape(tensor: torch.Tensor, spec: TensorSpec) -> tuple[int, ...]:
    """Shape in the Definition's terms: packed fp4 holds two values per stored element."""
    shape = tuple(tensor.shape)
    if spec.dtype.is_packed and shape:
        shape = shape[:-1] + (shape[-1] * 2,)
    return shape


def bind_axes(
    definition: Definition,
    tensors: Mapping[str, Any],
    *,
    include_outputs: bool = False,
    check_dtype: bool = True,
) -> dict[str, int]:
    """Return the var-axis values implied by ``tensors`` (inputs, and outputs if asked).

    Raises :class:`BindingError` naming the tensor and dimension when a const axis disagrees,
    a var axis takes two values, a rank or dtype is wrong, or a required input is missing.
    """
    specs: dict[str, TensorSpec] = dict(definition.inputs)
    if include_outputs:
        specs.update(definition.outputs)
    values: dict[str, int] = {}
    origin: dict[str, str] = {}
    for name, spec in specs.items():
        if name not in tensors:
            if spec.optional or (include_outputs and name in definition.outputs):
                continue
            raise BindingError(f"{definition.name}: input {name!r} is missing")
        value = tensors[name]
        if spec.shape is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise BindingError(f"{definition.name}: {name} should be a tensor, got {type(value).__name__}")
        if check_dtype and value.dtype != torch_dtype(spec.dtype):
            raise BindingError(
                f"{definition.name}: {name} has dtype {value.dtype}, expected {spec.dtype.value}"
            )
        shape = logical_shape(value, spec)
        if len(shape) != len(spec.shape):
            raise BindingError(
                f"{definition.name}: {name} has rank {len(shape)}, expected {len(spec.shape)} {spec.shape}"
            )
        for dim, (axis, size) in enumerate(zip(spec.shape, shape)):
            where = f"{name}.shape[{dim}]"
            if axis in definition.const_axes:
                if size != definition.const_axes[axis]:
                    raise BindingError(
                        f"{definition.name}: {where} is {size}, but const axis {axis} is "
                        f"{definition.const_axes[axis]}"
                    )
            elif values.setdefault(axis, size) != size:
                raise BindingError(
                    f"{definition.name}: axis {axis} is {values[axis]} from {origin[axis]} but {size} from {where}"
                )
            origin.setdefault(axis, where)
    return values


def failed_constraints(
    definition: Definition, var_values: Mapping[str, int], tensors: Mapping[str, Any]
) -> list[str]:
    """The constraints that do not hold (or cannot be evaluated) for these values."""
    env = {**definition.axis_values(dict(var_values)), **tensors}
    failed = []
    for constraint in definition.parsed_constraints:
        try:
            ok = constraint.holds(env)
        except (ConstraintError, ArithmeticError, IndexError, TypeError, RuntimeError) as exc:
            failed.append(f"{constraint.source} ({exc})")
            continue
        if not ok:
            failed.append(constraint.source)
    return failed
