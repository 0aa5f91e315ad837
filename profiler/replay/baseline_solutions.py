"""The shipped baseline Solutions for a Definition (``--solutions baselines``), from its op family
(:mod:`fi_profile.families`): the family's PyTorch baselines, plain (``torch``) and under
``torch.compile`` (``torch_compile``), and the engines' native kernels where their libraries
import (CUDA only).

A baseline source fits a Definition when the Definition's inputs are parameters of its ``run``
and every parameter without a default is an input (and its outputs those the source's
``OUTPUTS`` names, where it names them). Its constants (``EPS``, RoPE parameters, ``top_k``) are
set from the Definition's reference or const axes, so one source serves every shape of an op.
"""

from __future__ import annotations

import ast
from typing import Optional

from fi_profile.families import family_of
from fi_profile.families.family import FITTED_BASELINE, Baseline, Family, Native
from fi_profile.families.sources import read_source, set_constants
from fi_profile.schema.definition import Definition
from fi_profile.schema.reference import entry_signature, reference_constant, top_level_assignments
from fi_profile.schema.solution import Solution


def _fits(definition: Definition, source: str) -> bool:
    """The Definition's inputs are ``run``'s parameters (the required ones at least), and its outputs
    those the source's ``OUTPUTS`` names, where it names them."""
    signature = entry_signature(source, "run")
    outputs = _declared_outputs(source)
    if outputs is not None and tuple(definition.outputs) != outputs:
        return False
    return set(signature.required) <= set(definition.inputs) <= set(signature.params)


def _declared_outputs(source: str) -> Optional[tuple[str, ...]]:
    """A source's ``OUTPUTS = (...)``, or None where it returns the Definition's one output."""
    node = top_level_assignments(source).get("OUTPUTS")
    return None if node is None else tuple(ast.literal_eval(node.value))


def _constant(definition: Definition, name: str) -> Optional[str]:
    """The value the Definition gives constant ``name`` (a const axis, or its reference's), as a literal."""
    if name in definition.const_axes:
        return repr(definition.const_axes[name])
    return reference_constant(definition.reference, name)


def fitted_baseline(definition: Definition) -> Optional[tuple[Family, Baseline, str]]:
    """The family's first baseline that fits ``definition``, and its source with the Definition's
    constants set; None when none fits (or the Definition gives not all of a baseline's constants:
    its defaults would be a different op)."""
    family = family_of(definition.op_type)
    if family is None:
        return None
    for baseline in family.baselines:
        if baseline.op_type not in (None, definition.op_type):
            continue
        source = read_source(family.package, baseline.file)
        if not _fits(definition, source):
            continue
        values = {name: _constant(definition, name) for name in baseline.constants}
        if any(value is None for value in values.values()):
            continue
        values.update({name: value for name in baseline.optional_constants
                       if (value := _constant(definition, name)) is not None})
        return family, baseline, set_constants(source, values, f"{family.package}/{baseline.file}")
    return None


def torch_source(definition: Definition) -> Optional[str]:
    """The family source fitted to ``definition``, or None when no family fits."""
    fitted = fitted_baseline(definition)
    return None if fitted is None else fitted[2]


def baseline_solutions(definition: Definition) -> list[Solution]:
    fitted = fitted_baseline(definition)
    solutions = []
    if fitted is not None:
        _, baseline, source = fitted
        languages = ("python", "torch_compile") if baseline.compiled else ("python",)
        overwrites = dict(definition.overwrites or {}) if baseline.in_place else None
        for language in languages:
            label = "torch" if language == "python" else "torch_compile"
            solutions.append(_solution(definition, label, language, source, "PyTorch baseline shipped with fi-profile",
                                       overwrites=overwrites))
    solutions += native_solutions(definition)
    return solutions


def _solution(definition: Definition, label: str, language: str, source: str, description: str,
              siblings: Optional[dict[str, str]] = None, overwrites: Optional[dict[str, Optional[str]]] = None,
              computes: Optional[list[str]] = None) -> Solution:
    """``source`` as ``main.py``; ``siblings``: other files of the Solution, which it imports;
    ``overwrites``: the inputs it works in place on; ``computes``: its outputs, where not all."""
    sources = [{"path": "main.py", "content": source}] + [{"path": p, "content": c} for p, c in (siblings or {}).items()]
    spec = {"language": language, "target_hardware": [], "entry_point": "main.py::run"}
    if overwrites:
        spec["overwrites"] = overwrites
    if computes:
        spec["computes"] = computes
    return Solution.model_validate(
        {
            "name": f"{definition.name}__{label}",
            "definition": definition.name,
            "description": description,
            "author": "fi-profile",
            "spec": spec,
            "sources": sources,
        }
    )


def native_candidates(definition: Definition) -> list[tuple[Family, Native]]:
    """The engines' kernels that compute ``definition``, by its family's rule (whether their
    libraries import here or not)."""
    family = family_of(definition.op_type)
    if family is None:
        return []
    fitted = fitted_baseline(definition)
    baseline = None if fitted is None else fitted[1].file
    found = []
    for native in family.natives(definition, baseline):
        if native.must_fit and not _fits(definition, read_source(family.package, native.file)):
            continue
        found.append((family, native))
    return found


def native_solution(definition: Definition, family: Family, native: Native) -> Solution:
    """``native`` as a Solution for ``definition``: its source with the constants the Definition
    gives, and its sibling files."""
    label = f"{family.package}/{native.file}"
    source = read_source(family.package, native.file)
    values = {name: value for name in native.constants if (value := _constant(definition, name)) is not None}
    source = set_constants(source, values, label)
    siblings = {}
    for path, file in native.siblings.items():
        if file == FITTED_BASELINE:
            fitted = torch_source(definition)
            if fitted is None:
                raise ValueError(f"{label} needs the family's fitted baseline, and none fits {definition.name}")
            siblings[path] = fitted
        else:
            siblings[path] = read_source(family.package, file)
    overwrites = None if native.overwrites is None else dict(native.overwrites(definition))
    computes = None if native.computes is None else [n for n in definition.outputs if n in native.computes]
    return _solution(definition, native.label or native.library, "python", source,
                     f"{native.library}'s kernel, as the engine calls it", siblings, overwrites, computes)


def _importable(module: str) -> bool:
    """``module`` is there (a dotted name whose parent package is missing is not: another version)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def native_solutions(definition: Definition) -> list[Solution]:
    """vLLM / FlashInfer kernels for this Definition, when the library imports here (CUDA only)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for family, native in native_candidates(definition):
        if importlib.util.find_spec(native.library) is None:
            continue
        modules = (native.requires,) if isinstance(native.requires, str) else native.requires or ()
        if modules and not any(_importable(module) for module in modules):
            continue  # e.g. a vLLM build without its MoE kernels
        found.append(native_solution(definition, family, native))
    return found
