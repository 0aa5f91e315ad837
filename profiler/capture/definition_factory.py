"""Definitions for captured calls: the shipped one when the constants match, else one made from
the shipped Definition of the same op (its template) with the call's constants.

A template is instantiated by renaming it, setting its const axes, setting the literals of the
reference's ``assert axis == value`` checks, ``axis = value`` lines and ``NAME = value`` constants
(found in its parsed source, never by a pattern on its text), and switching its dtype.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Mapping, Union

from fi_profile.catalog import shipped_definition
from fi_profile.schema.definition import AxisConst, Definition
from fi_profile.schema.dtype import DType
from fi_profile.schema.reference import literal_assignments, literal_type, reference_constant, replace_nodes

_TEMPLATE_DTYPE = DType.bfloat16
#: input dtypes a shipped Definition may keep whatever the call's dtype (indices, scales, probabilities)
_INDEX_OR_FP32 = (DType.float32, DType.int32, DType.int64)
Number = Union[int, float]


def definition_for(
    template_name: str,
    name: str,
    consts: Mapping[str, int],
    dtype: DType,
    reference_constants: Mapping[str, Number] = {},
    input_dtypes: Mapping[str, DType] = {},
) -> Definition:
    """The Definition ``name``: shipped if it matches, else ``template_name`` instantiated.

    ``input_dtypes`` names inputs (or outputs) whose dtype differs from ``dtype`` (e.g. float32
    router logits, a float32 state and the new state)."""
    return _definition_for(
        template_name,
        name,
        tuple(sorted(consts.items())),
        dtype,
        tuple(sorted(reference_constants.items())),
        tuple(sorted(input_dtypes.items())),
    )


@lru_cache(maxsize=None)
def _definition_for(
    template_name: str,
    name: str,
    consts: tuple[tuple[str, int], ...],
    dtype: DType,
    reference_constants: tuple[tuple[str, Number], ...],
    input_dtypes: tuple[tuple[str, DType], ...],
) -> Definition:
    shipped = shipped_definition(name)
    if shipped is not None and _matches(shipped, dict(consts), dtype, dict(reference_constants), dict(input_dtypes)):
        return shipped
    template = shipped_definition(template_name)
    if template is None:
        raise KeyError(f"no shipped template Definition {template_name!r}")
    return instantiate(template, name, dict(consts), dtype, dict(reference_constants), dict(input_dtypes))


def _matches(
    definition: Definition,
    consts: dict[str, int],
    dtype: DType,
    constants: dict[str, Number],
    input_dtypes: dict[str, DType],
) -> bool:
    if any(definition.const_axes.get(a) != v for a, v in consts.items()):
        return False
    for input_name, spec in definition.inputs.items():
        allowed = (input_dtypes[input_name],) if input_name in input_dtypes else (dtype, *_INDEX_OR_FP32)
        if spec.dtype not in allowed:
            return False
    if any(definition.outputs[o].dtype is not d for o, d in input_dtypes.items() if o in definition.outputs):
        return False
    return all(_constant_in(definition.reference, n, v) for n, v in constants.items())


def _constant_in(reference: str, name: str, value: Number) -> bool:
    literal = reference_constant(reference, name)
    try:
        return literal is not None and float(literal) == float(value)
    except ValueError:  # not a number (e.g. ``RENORMALIZE = True``)
        return False


def _axis_literals(tree: ast.AST, axis: str) -> list[ast.AST]:
    """Where a reference writes const axis ``axis`` as a literal: ``assert axis == 4096`` (also as
    one of an ``and`` of them: ``assert axis == 64 and other == 4``; not ``assert axis == 2 * other``)
    and ``axis = 4096``."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and node.msg is None:
            tests = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) \
                else [node.test]
            found += [test.comparators[0] for test in tests
                      if isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == axis
                      and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) and _integer(test.comparators[0])]
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and node.targets[0].id == axis and _integer(node.value)):
            found.append(node.value)
    return found


def _integer(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _with_constants(template: str, reference: str, consts: Mapping[str, int],
                    reference_constants: Mapping[str, Number]) -> str:
    """``reference`` with the const axes' literals and the constants (``EPS = 1e-5``) set, found in
    its parsed source; a constant it does not set is an error naming the template."""
    tree = ast.parse(reference)
    edits: list[tuple[ast.AST, str]] = [(node, str(value)) for axis, value in consts.items()
                                        for node in _axis_literals(tree, axis)]
    for constant, value in reference_constants.items():
        kinds = (bool,) if isinstance(value, bool) else (int, float)  # a switch (``TRUNCATE = False``) or a number
        found = [node for node in literal_assignments(tree, constant) if literal_type(node.value) in kinds]
        if not found:
            raise KeyError(f"{template}'s reference sets no constant {constant}")
        edits += [(node.value, repr(value)) for node in found]
    return replace_nodes(reference, edits)


def _with_dtype(reference: str, dtype: DType) -> str:
    """``reference`` computing in ``dtype`` where it names the templates' (``torch.bfloat16``)."""
    found = [node for node in ast.walk(ast.parse(reference)) if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr == _TEMPLATE_DTYPE.value]
    return replace_nodes(reference, [(node, f"torch.{dtype.value}") for node in found])


def instantiate(
    template: Definition,
    name: str,
    consts: Mapping[str, int],
    dtype: DType,
    reference_constants: Mapping[str, Number] = {},
    input_dtypes: Mapping[str, DType] = {},
) -> Definition:
    data = template.to_dict()
    data["name"] = name
    reference = data["reference"]
    for axis in consts:
        if not isinstance(template.axes.get(axis), AxisConst):
            raise KeyError(f"{template.name} has no const axis {axis!r}")
        data["axes"][axis]["value"] = consts[axis]
    reference = _with_constants(template.name, reference, consts, reference_constants)
    if dtype is not _TEMPLATE_DTYPE:
        reference = _with_dtype(reference, dtype)
        for group in ("inputs", "outputs"):
            for spec in data[group].values():
                if spec["dtype"] == _TEMPLATE_DTYPE.value:
                    spec["dtype"] = dtype.value
    for tensor, tensor_dtype in input_dtypes.items():  # an input's, or an output's (a state updated in place)
        data["inputs" if tensor in data["inputs"] else "outputs"][tensor]["dtype"] = tensor_dtype.value
    data["reference"] = reference
    data["tags"] = [t for t in data.get("tags", []) if not t.startswith(("model:", "status:"))] + [
        "status:generated"
    ]
    data["description"] = (
        f"Generated by fi-profile from {template.name} for a captured call. " + data.get("description", "")
    )
    return Definition.model_validate(data)
