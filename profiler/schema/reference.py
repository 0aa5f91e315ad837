"""Static checks of Python entry points (a Definition's reference, a Solution's ``run``)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional


@dataclass(frozen=True)
class EntrySignature:
    """Parameters of a top-level function, read from source without running it."""

    params: tuple[str, ...]
    required: tuple[str, ...]
    has_var_keyword: bool

    def accepts(self, names: list[str]) -> bool:
        return set(self.required) <= set(names) and (
            self.has_var_keyword or set(names) <= set(self.params)
        )


def entry_signature(source: str, function: str = "run") -> EntrySignature:
    """Parse ``source`` and return the signature of its top-level ``function``.

    Raises ValueError with a readable message when the source does not parse or does not define
    the function at top level.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"does not parse: line {exc.lineno}: {exc.msg}") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            args = node.args
            positional = [a.arg for a in args.posonlyargs + args.args]
            kwonly = [a.arg for a in args.kwonlyargs]
            n_default = len(args.defaults)
            required = positional[: len(positional) - n_default] + [
                a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None
            ]
            return EntrySignature(
                tuple(positional + kwonly), tuple(required), args.kwarg is not None
            )
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == function for t in node.targets
        ):
            # e.g. ``run = torch.compile(_impl)``: callable, parameters unknown statically.
            return EntrySignature((), (), True)
    raise ValueError(f"defines no top-level function {function!r}")


def literal_type(node: ast.AST) -> Optional[type]:
    """The type of a number, bool or string literal (``-1`` too), or None for any other expression."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool, str)):
        return type(node.value)
    return None


def _named_assignments(nodes: Iterable[ast.AST]) -> Iterator[ast.Assign]:
    """The ``NAME = ...`` statements among ``nodes`` (one plain name assigned)."""
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield node


def top_level_assignments(source: str) -> dict[str, ast.Assign]:
    """The source's top-level ``NAME = value`` statements, by name (the first of each)."""
    found: dict[str, ast.Assign] = {}
    for node in _named_assignments(ast.parse(source).body):
        found.setdefault(node.targets[0].id, node)  # type: ignore[attr-defined]
    return found


def literal_assignments(tree: ast.AST, name: str) -> list[ast.Assign]:
    """The ``NAME = literal`` statements anywhere in ``tree`` (a parsed source), in source order."""
    found = [node for node in _named_assignments(ast.walk(tree))
             if node.targets[0].id == name and literal_type(node.value) is not None]  # type: ignore[attr-defined]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def replace_nodes(source: str, replacements: list[tuple[ast.AST, str]]) -> str:
    """``source`` with the text of each node (of ``ast.parse(source)``) replaced by the text given."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode())

    spans = sorted(((offset(n.lineno, n.col_offset), offset(n.end_lineno, n.end_col_offset), text)  # type: ignore[arg-type]
                    for n, text in replacements), reverse=True)
    for start, end, text in spans:
        source = source[:start] + text + source[end:]
    return source


def reference_constant(source: str, name: str) -> Optional[str]:
    """The literal of the first ``NAME = literal`` in ``source`` (e.g. ``EPS = 1e-5``), as written."""
    found = literal_assignments(ast.parse(source), name)
    return ast.get_source_segment(source, found[0].value) if found else None
