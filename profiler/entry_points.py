"""Load a Python entry point (a reference's or a solution's ``run``) from source text."""

from __future__ import annotations

import hashlib
import types
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from fi_profile.schema.definition import Definition

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


def outputs_by_name(definition: Definition, result: Any, names: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Name a value-returning ``run``'s result by the Definition's outputs (or by ``names``, the
    outputs it returns when others are written into its inputs)."""
    names = list(definition.outputs) if names is None else list(names)
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
    """Run the Definition's reference on ``inputs`` (by name) and name its outputs.

    Either form of reference works: one that returns its outputs (seed 002), or one that takes the
    pre-allocated outputs after the inputs and fills them (seed 001's code schema); the outputs
    are then allocated here, their shapes bound from the inputs."""
    fn = load_function(definition.reference, "run", label=definition.name)
    if not definition.reference_destination_passing:
        return outputs_by_name(definition, fn(**inputs))
    outputs = allocate_outputs(definition, inputs)
    fn(**inputs, **outputs)
    return outputs


def allocate_outputs(definition: Definition, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Empty output tensors for these inputs: var axes bound from the inputs' shapes, on the
    inputs' device."""
    from fi_profile.binding import BindingError, bind_axes
    from fi_profile.schema.dtype import torch_dtype

    axes = definition.axis_values(bind_axes(definition, inputs, check_dtype=False))
    device = next((v.device for v in inputs.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    outputs = {}
    for name, spec in definition.outputs.items():
        unbound = [a for a in spec.shape or [] if a not in axes]
        if unbound:
            raise BindingError(f"{definition.name}: output {name} has axes {unbound} that no input fixes")
        shape = definition.shape_of(spec, axes)
        if spec.dtype.is_packed and shape:  # two fp4 values per stored element
            shape = shape[:-1] + (shape[-1] // 2,)
        outputs[name] = torch.empty(shape, dtype=torch_dtype(spec.dtype), device=device)
    return outputs
