"""Build valid inputs for any Definition and var-axis values, on CPU or CUDA.

Given tensors (captured ones) take precedence; the rest is synthesised to agree with them, and
every constraint of the Definition is checked before the inputs are handed out.
"""

from __future__ import annotations

import ast
from typing import Any, Mapping, Optional, Union

import torch

from fi_profile.binding import failed_constraints
from fi_profile.schema.constraint import Constraint
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import torch_dtype
from fi_profile.synthesis.layout import INDPTR_SUFFIXES, SynthesisError, build_layout
from fi_profile.synthesis.values import default_scalar, tensor_value

__all__ = ["SynthesisError", "small_axes", "synthesize_inputs"]

#: Small var-axis values for smoke runs; unnamed axes get ``_SMALL``.
_SMALL = 4
_SMALL_AXES = {"num_pages": 16, "max_seq_len": 32, "max_position": 32}
_MAX_DOUBLINGS = 16


def small_axes(definition: Definition, **overrides: int) -> dict[str, int]:
    """Small var-axis values that satisfy the Definition's axis-only constraints.

    Index-pointer lengths follow the batch size; equalities (``len_indptr == batch_size + 1``)
    are solved for their left side; an axis in a failing inequality is doubled until it holds.
    """
    values = {a: overrides.get(a, _SMALL_AXES.get(a, _SMALL)) for a in definition.var_axes}
    batch = values.get("batch_size", _SMALL)
    for name, spec in definition.inputs.items():
        if name.endswith(INDPTR_SUFFIXES) and spec.shape and spec.shape[0] in values:
            values[spec.shape[0]] = overrides.get(spec.shape[0], batch + 1)
    tensor_names = set(definition.inputs) | set(definition.outputs)
    axis_only = [c for c in definition.parsed_constraints if not c.references_tensors(tensor_names)]
    for constraint in axis_only:
        node = constraint.tree.body
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.Eq)
            and isinstance(node.left, ast.Name)
            and node.left.id in values
            and node.left.id not in overrides
        ):
            right_side = Constraint.parse(ast.unparse(node.comparators[0]))
            values[node.left.id] = int(right_side.evaluate(definition.axis_values(values)))
    for constraint in axis_only:
        free = [a for a in constraint.names() if a in values and a not in overrides]
        for _ in range(_MAX_DOUBLINGS):
            if not free or constraint.holds(definition.axis_values(values)):
                break
            for axis in free:
                values[axis] *= 2
    return values


def synthesize_inputs(
    definition: Definition,
    var_axes: Mapping[str, int],
    *,
    device: Union[str, torch.device] = "cpu",
    seed: int = 0,
    given: Optional[Mapping[str, Any]] = None,
    scalars: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """Inputs for ``definition`` at ``var_axes``, keyed by input name in definition order."""
    missing = [a for a in definition.var_axes if a not in var_axes]
    if missing:
        raise SynthesisError(f"{definition.name}: no value for var axes {missing}")
    device = torch.device(device)
    given = dict(given or {})
    scalars = dict(scalars or {})
    axes = definition.axis_values(dict(var_axes))
    structure_gen = torch.Generator().manual_seed(seed)
    data_gen = torch.Generator(device=device).manual_seed(seed)

    given_tensors = {k: v for k, v in given.items() if isinstance(v, torch.Tensor)}
    layout = build_layout(definition, axes, given_tensors, structure_gen)
    inputs: dict[str, Any] = {}
    for name, spec in definition.inputs.items():
        if name in given:
            value = given[name]
            inputs[name] = value.to(device) if isinstance(value, torch.Tensor) else value
        elif spec.shape is None:
            inputs[name] = scalars.get(name, default_scalar(name, spec, definition))
        elif name in layout:
            inputs[name] = layout[name].to(device=device, dtype=torch_dtype(spec.dtype))
        else:
            shape = definition.shape_of(spec, axes)
            assert shape is not None
            inputs[name] = tensor_value(name, spec, shape, definition, axes, data_gen, device)
    failed = failed_constraints(definition, var_axes, inputs)
    if failed:
        raise SynthesisError(f"{definition.name}: inputs break constraints {failed}")
    return inputs
