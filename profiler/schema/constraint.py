"""Definition constraints: small Python expressions over axis names and input tensors.

They are parsed with :mod:`ast` and interpreted node by node; only arithmetic, comparisons,
boolean logic, ``.shape``, indexing, ``.item()``/``.numel()``/``.dim()``, ``len``, ``min``,
``max`` and ``abs`` are allowed, so a constraint can never run arbitrary code.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"len": len, "min": min, "max": max, "abs": abs}
_METHODS = {"item", "numel", "dim", "size"}
_ATTRIBUTES = {"shape"}
_MAX_EXPONENT = 64


class ConstraintError(ValueError):
    """A constraint that cannot be parsed or evaluated."""


@dataclass(frozen=True)
class Constraint:
    source: str
    tree: ast.Expression = field(repr=False, compare=False)

    @classmethod
    def parse(cls, source: str) -> "Constraint":
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ConstraintError(f"not a valid expression: {exc.msg}") from None
        _check_allowed(tree.body)
        return cls(source, tree)

    def names(self) -> set[str]:
        """Free names (axes or tensors) the expression refers to, functions excluded."""
        called = {
            n.func.id
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        return {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)} - called

    def references_tensors(self, tensor_names: set[str]) -> bool:
        return bool(self.names() & tensor_names)

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        return _eval(self.tree.body, env)

    def holds(self, env: Mapping[str, Any]) -> bool:
        return bool(self.evaluate(env))


def _check_allowed(node: ast.AST) -> None:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, bool)):
            raise ConstraintError(f"constant {node.value!r} is not a number")
    elif isinstance(node, ast.Name):
        pass
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check_allowed(node.left)
        _check_allowed(node.right)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check_allowed(node.operand)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            _check_allowed(value)
    elif isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        _check_allowed(node.left)
        for comparator in node.comparators:
            _check_allowed(comparator)
    elif isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTES:
        _check_allowed(node.value)
    elif isinstance(node, ast.Subscript):
        _check_allowed(node.value)
        _check_allowed(node.slice)
    elif isinstance(node, ast.Call) and not node.keywords:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _FUNCTIONS:
            pass
        elif isinstance(func, ast.Attribute) and func.attr in _METHODS:
            _check_allowed(func.value)
        else:
            raise ConstraintError(f"call of {ast.unparse(func)!r} is not allowed")
        for arg in node.args:
            _check_allowed(arg)
    else:
        raise ConstraintError(f"{ast.unparse(node)!r} is not allowed in a constraint")


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ConstraintError(f"unknown name {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ConstraintError(f"exponent {right} is too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env))
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Attribute):
        return tuple(getattr(_eval(node.value, env), node.attr))
    if isinstance(node, ast.Subscript):
        return _eval(node.value, env)[_eval(node.slice, env)]
    if isinstance(node, ast.Call):
        args = [_eval(a, env) for a in node.args]
        if isinstance(node.func, ast.Name):
            return _FUNCTIONS[node.func.id](*args)
        target = _eval(node.func.value, env)  # type: ignore[attr-defined]
        method = getattr(target, node.func.attr, None)  # type: ignore[attr-defined]
        if method is None:
            raise ConstraintError(f"{type(target).__name__} has no {node.func.attr}()")  # type: ignore[attr-defined]
        return method(*args)
    raise ConstraintError(f"{ast.unparse(node)!r} is not allowed in a constraint")
