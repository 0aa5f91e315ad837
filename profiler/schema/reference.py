"""Static checks of Python entry points (a Definition's reference, a Solution's ``run``)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional


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


def reference_constant(source: str, name: str) -> Optional[str]:
    """The literal of a top-level-looking ``NAME = value`` line in ``source`` (e.g. ``EPS = 1e-5``)."""
    found = re.search(rf"^\s*{re.escape(name)} = (\S+)\s*$", source, flags=re.M)
    return found.group(1) if found else None
