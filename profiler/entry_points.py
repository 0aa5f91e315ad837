"""Load a Python entry point (a reference's or a solution's ``run``) from source text."""

from __future__ import annotations

import hashlib
import types
from typing import Any, Callable, Mapping, Sequence

from profiler.schema.definition import Definition

_MODULES: dict[str, types.ModuleType] = {}


def load_function(source: str, function: str = "run", label: str = "entry") -> Callable[..., Any]:
    """Execute ``source`` as a fresh module (cached by content) and return ``function`` from it."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    module = _MODULES.get(digest)
    if module is None:
        module = types.ModuleType(f"fi_profile_{label}_{digest}")
        code = compile(source, f"<{label}>", "exec")
        exec(code, module.__dict__)  # noqa: S102 - running kernel code is the point
        _MODULES[digest] = module
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"{label} defines no callable {function!r}")
    return fn


def outputs_by_name(definition: Definition, result: Any) -> dict[str, Any]:
    """Name a value-returning ``run``'s result by the Definition's outputs."""
    names: Sequence[str] = list(definition.outputs)
    if isinstance(result, Mapping):
        if set(result) != set(names):
            raise ValueError(f"returned keys {sorted(result)}, expected {sorted(names)}")
        return {n: result[n] for n in names}
    if len(names) == 1 and not isinstance(result, (tuple, list)):
        return {names[0]: result}
    if not isinstance(result, (tuple, list)) or len(result) != len(names):
        got = len(result) if isinstance(result, (tuple, list)) else 1
        raise ValueError(f"returned {got} values, expected {len(names)} {tuple(names)}")
    return dict(zip(names, result))


def run_reference(definition: Definition, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run the Definition's reference on ``inputs`` (by name) and name its outputs."""
    fn = load_function(definition.reference, "run", label=definition.name)
    return outputs_by_name(definition, fn(**inputs))
