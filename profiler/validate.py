"""``fi-profile validate``: check files of every kind, alone and against each other.

Workload lines and solutions are checked against the Definition they name: one found among the
validated paths, else a shipped one. Captured-tensor files that are missing are a warning, not an
error: replay synthesises those inputs (flashinfer-trace ships its workloads without blobs).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from safetensors import safe_open

from fi_profile.catalog import shipped_definitions
from fi_profile.documents import Document, Kind, dataset_root, document_files, iter_objects, parse_object
from fi_profile.errors import Problem, format_loc
from fi_profile.schema import Definition, KernelCallingRecord, LegacyKernelDescription, Solution, Trace
from fi_profile.schema.workload import SafetensorsInput


@dataclass
class ValidationReport:
    documents: list[Document] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if not p.warning]

    def counts(self) -> Counter[Kind]:
        return Counter(d.kind for d in self.documents)


def validate_paths(paths: Sequence[Path]) -> ValidationReport:
    report = ValidationReport()
    files, missing = document_files(list(paths))
    report.problems.extend(missing)
    for path in files:
        for item in iter_objects(path):
            if isinstance(item, Problem):
                report.problems.append(item)
                continue
            document, problems = _guarded(item[0], parse_object, *item)
            report.problems.extend(problems)
            if document is not None:
                report.documents.append(document)
    definitions = _collect_definitions(report)
    _cross_check(report, definitions)
    return report


class DefinitionScope:
    """Definitions by dataset root: a workload resolves names in its own dataset first, then in
    the other validated paths, then among the shipped ones. The same name in two datasets is
    fine (flashinfer-trace's float16 GEMMs and ours in bfloat16); twice in one dataset is not."""

    def __init__(self) -> None:
        self.by_root: dict[Path, dict[str, Definition]] = {}

    def add(self, root: Path, definition: Definition) -> None:
        self.by_root.setdefault(root, {})[definition.name] = definition

    def lookup(self, name: str, root: Path) -> Definition | None:
        local = self.by_root.get(root, {})
        if name in local:
            return local[name]
        for definitions in self.by_root.values():
            if name in definitions:
                return definitions[name]
        return shipped_definitions().get(name)


def _definition_root(file: Path) -> Path:
    return dataset_root(file, "definitions")


def _collect_definitions(report: ValidationReport) -> DefinitionScope:
    scope = DefinitionScope()
    defined_in: dict[tuple[Path, str], str] = {}
    for doc in report.documents:
        if doc.kind is Kind.definition:
            definition = doc.model
        elif doc.kind is Kind.legacy_definition:
            assert isinstance(doc.model, LegacyKernelDescription)
            definition = doc.model.to_definition()
        else:
            continue
        assert isinstance(definition, Definition)
        root = _definition_root(Path(doc.label))
        key = (root, definition.name)
        if key in defined_in:
            report.problems.append(
                Problem(doc.label, "name", f"{definition.name!r} is also defined in {defined_in[key]}")
            )
            continue
        defined_in[key] = doc.label
        scope.add(root, definition)
    return scope


def _cross_check(report: ValidationReport, definitions: DefinitionScope) -> None:
    missing_blobs: Counter[str] = Counter()
    seen_uuids: dict[str, str] = {}
    for doc in report.documents:
        model = doc.model
        if isinstance(model, Trace):
            report.problems.extend(_guarded(doc.label, _check_trace, doc, model, definitions, missing_blobs))
            # a workload once per dataset; a trace once per (workload, solution)
            key = f"{model.workload.uuid}" + (f" of {model.solution}" if model.solution is not None else "")
            if key in seen_uuids:
                report.problems.append(Problem(doc.label, "workload.uuid", f"{key} repeats {seen_uuids[key]}"))
            seen_uuids.setdefault(key, doc.label)
        elif isinstance(model, Solution):
            report.problems.extend(_guarded(doc.label, _check_solution, doc, model, definitions))
        elif isinstance(model, KernelCallingRecord):
            for i, kernel in enumerate(model.kernels):
                if definitions.lookup(kernel.id, _definition_root(Path(doc.label))) is None:
                    report.problems.append(
                        Problem(doc.label, f"kernels.{i}.id", f"no Definition named {kernel.id!r} is known", warning=True)
                    )
    for file, count in sorted(missing_blobs.items()):
        report.problems.append(
            Problem(file, "", f"{count} captured-tensor file(s) missing; replay synthesises those inputs", warning=True)
        )


def _guarded(label: str, check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``; a check that fails in a way nobody foresaw is one problem of the file it
    was checking, never a traceback (validate reads any file it is given)."""
    try:
        return check(*args)
    except Exception as exc:  # noqa: BLE001 - reported as a problem of this file
        problem = [Problem(label, "", f"could not be checked: {type(exc).__name__}: {exc}"[:500])]
        return (None, problem) if check is parse_object else problem


def _check_trace(
    doc: Document, trace: Trace, definitions: DefinitionScope, missing_blobs: Counter[str]
) -> list[Problem]:
    file = doc.label.rsplit(":", 1)[0]
    root = dataset_root(Path(file), "traces" if trace.solution is not None else "workloads")
    definition = definitions.lookup(trace.definition, root)
    if definition is None:
        return [Problem(doc.label, "definition", f"no Definition named {trace.definition!r} is known")]
    problems = [
        Problem(doc.label, format_loc(("workload",) + loc), msg)
        for loc, msg in trace.workload.problems_against(definition)
    ]
    for name, source in trace.workload.inputs.items():
        if not isinstance(source, SafetensorsInput):
            continue
        blob = root / source.path
        if not blob.is_file():
            missing_blobs[file] += 1
            continue
        try:
            with safe_open(str(blob), framework="pt") as handle:
                keys = set(handle.keys())
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type
            message = f"{blob} is not a readable safetensors file: {exc}"
            problems.append(Problem(doc.label, f"workload.inputs.{name}.path", message))
            continue
        if source.tensor_key not in keys:
            problems.append(
                Problem(doc.label, f"workload.inputs.{name}.tensor_key", f"{blob} holds no tensor {source.tensor_key!r}")
            )
    return problems


def _check_solution(doc: Document, solution: Solution, definitions: DefinitionScope) -> list[Problem]:
    definition = definitions.lookup(solution.definition, _definition_root(Path(doc.label)))
    if definition is None:
        return [Problem(doc.label, "definition", f"no Definition named {solution.definition!r} is known")]
    if not solution.spec.language.entry_is_python:
        return []
    inputs, outputs = list(definition.inputs), list(definition.outputs)
    expected = inputs + outputs if solution.is_destination_passing(inputs, outputs) else inputs
    signature = solution.entry_signature()
    if not signature.accepts(expected):
        return [
            Problem(
                doc.label,
                "spec.entry_point",
                f"{solution.spec.entry_function}{signature.params} does not take {tuple(expected)} by name",
            )
        ]
    return []
