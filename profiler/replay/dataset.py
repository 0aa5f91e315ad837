"""What replay reads: a capture output or a flashinfer-trace folder (the same layout), and the
Solutions to try. Problems name the file and the field."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pydantic import ValidationError

from fi_profile.documents import Kind, detect_kind
from fi_profile.errors import problems_from_validation_error
from fi_profile.schema import Definition, KernelCallingRecord, LegacyKernelDescription, Solution, Trace, Workload


class DatasetError(Exception):
    """Bad input: every line is ``file: field: message``."""


@dataclass
class Dataset:
    root: Path
    definitions: dict[str, Definition]
    workloads: dict[str, list[Workload]] = field(default_factory=dict)
    record: Optional[KernelCallingRecord] = None


def _fail(path: Path, exc: ValidationError) -> DatasetError:
    return DatasetError("\n".join(str(p) for p in problems_from_validation_error(str(path), exc)))


def load_dataset(root: Path, names: Optional[list[str]] = None) -> Dataset:
    if not (root / "definitions").is_dir():
        raise DatasetError(f"{root}: no definitions/ folder (expected a capture output or a flashinfer-trace dataset)")
    definitions: dict[str, Definition] = {}
    for path in sorted((root / "definitions").rglob("*.json")):
        definition = _read_definition(path)
        if definition.name in definitions:
            raise DatasetError(f"{path}: name: {definition.name!r} is also defined in another file of {root / 'definitions'}")
        definitions[definition.name] = definition
    if names:
        unknown = sorted(set(names) - set(definitions))
        if unknown:
            raise DatasetError(f"{root}/definitions: no definition named {', '.join(unknown)}")
        definitions = {n: definitions[n] for n in names}
    dataset = Dataset(root, definitions)
    for path in sorted((root / "workloads").rglob("*.jsonl")) if (root / "workloads").is_dir() else []:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                trace = Trace.model_validate_json(line)
            except ValidationError as exc:
                raise _fail(Path(f"{path}:{number}"), exc) from None
            if trace.definition in definitions:
                dataset.workloads.setdefault(trace.definition, []).append(trace.workload)
    record = root / "record.json"
    if record.is_file():
        try:
            dataset.record = KernelCallingRecord.model_validate_json(record.read_text())
        except ValidationError as exc:
            raise _fail(record, exc) from None
    return dataset


def _read_definition(path: Path) -> Definition:
    """A Definition (seed 002) or a seed-001 kernel description, converted."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}") from None
    model = LegacyKernelDescription if detect_kind(data) is Kind.legacy_definition else Definition
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise _fail(path, exc) from None
    return parsed.to_definition() if isinstance(parsed, LegacyKernelDescription) else parsed


def load_solutions(paths: list[Path], definitions: Optional[dict[str, Definition]] = None) -> list[Solution]:
    """Solution JSON files, or folders of them. With ``definitions``, what a Solution says about its
    Definition's tensors (``spec.overwrites``) is checked against it (the caller checks that the
    Definitions named exist)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(path.rglob("*.json"))
        elif path.is_file():
            files.append(path)
        else:
            raise DatasetError(f"{path}: no such file or folder")
    solutions = []
    for file in files:
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{file}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        for i, item in enumerate(data if isinstance(data, list) else [data]):
            label = Path(f"{file}[{i}]") if isinstance(data, list) else file
            try:
                solution = Solution.model_validate(item)
            except ValidationError as exc:
                raise _fail(label, exc) from None
            definition = (definitions or {}).get(solution.definition)
            problems = solution.problems_with(definition) if definition is not None else []
            if problems:
                raise DatasetError("\n".join(f"{label}: {'.'.join(map(str, loc))}: {message}" for loc, message in problems))
            solutions.append(solution)
    return solutions
