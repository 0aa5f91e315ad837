"""Read JSON and JSONL files, tell which kind of document each object is, and parse it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from pydantic import BaseModel, ValidationError

from fi_profile.errors import Problem, problems_from_validation_error
from fi_profile.schema import (
    AgentConversation,
    AgentTrace,
    BenchmarkResult,
    Definition,
    KernelCallingRecord,
    LegacyKernelDescription,
    Solution,
    Trace,
)
from fi_profile.schema.time_breakdown import TimeBreakdownDocument


class Kind(str, Enum):
    definition = "definition"
    legacy_definition = "legacy kernel description"
    solution = "solution"
    calling_record = "kernel calling record"
    trace = "workload"
    benchmark_result = "benchmark result"
    agent_conversation = "agent conversation"
    agent_trace = "agent trace"
    time_breakdown = "replay time breakdown"


MODELS: dict[Kind, type[BaseModel]] = {
    Kind.definition: Definition,
    Kind.legacy_definition: LegacyKernelDescription,
    Kind.solution: Solution,
    Kind.calling_record: KernelCallingRecord,
    Kind.trace: Trace,
    Kind.benchmark_result: BenchmarkResult,
    Kind.agent_conversation: AgentConversation,
    Kind.agent_trace: AgentTrace,
    Kind.time_breakdown: TimeBreakdownDocument,
}

DOCUMENT_SUFFIXES = (".json", ".jsonl")


def detect_kind(obj: Any) -> Optional[Kind]:
    """Guess the kind from the fields present; the model then checks everything."""
    if isinstance(obj, list):
        if obj and all(isinstance(e, dict) and "type" in e for e in obj):
            return Kind.agent_trace
        return None
    if not isinstance(obj, dict):
        return None
    keys = set(obj)
    if {"definition", "workload"} <= keys:
        return Kind.trace
    if "kernel_id" in keys:
        return Kind.benchmark_result
    if {"framework", "kernels"} <= keys:
        return Kind.calling_record
    if {"spec", "sources"} & keys:
        return Kind.solution
    if {"pairs", "phases_s"} <= keys:
        return Kind.time_breakdown
    if "conversation" in keys:
        return Kind.agent_conversation
    if keys & {"reference_code", "code", "assumptions", "id"}:
        return Kind.legacy_definition
    if keys & {"reference", "op_type", "axes"}:
        return Kind.definition
    return None


@dataclass(frozen=True)
class Document:
    label: str  # file, or file:line for JSONL
    kind: Kind
    model: BaseModel


def parse_object(label: str, obj: Any, kind: Optional[Kind] = None) -> tuple[Optional[Document], list[Problem]]:
    kind = kind or detect_kind(obj)
    if kind is None:
        expected = ", ".join(k.value for k in Kind)
        return None, [Problem(label, "", f"cannot tell what this document is (expected one of: {expected})")]
    try:
        model = MODELS[kind].model_validate(obj)
    except ValidationError as exc:
        return None, problems_from_validation_error(label, exc)
    return Document(label, kind, model), []


def iter_objects(path: Path) -> Iterator[Union[tuple[str, Any], Problem]]:
    """``(label, object)`` for each document in a file, or a Problem where JSON is broken."""
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        yield Problem(label, "", f"cannot read: {exc}")
        return
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                yield from _decode(f"{label}:{number}", line)
    else:
        yield from _decode(label, text)


def _decode(label: str, text: str) -> Iterator[Union[tuple[str, Any], Problem]]:
    try:
        yield label, json.loads(text)
    except json.JSONDecodeError as exc:
        yield Problem(label, f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}")
    except RecursionError:
        yield Problem(label, "", "invalid JSON: nested too deeply to read")


def dataset_root(file: Path, folder: str) -> Path:
    """The dataset a file belongs to: the folder holding its ``folder`` ancestor (``workloads``,
    ``definitions``), else the file's own folder."""
    for parent in file.resolve().parents:
        if parent.name == folder:
            return parent.parent
    return file.resolve().parent


def document_files(paths: list[Path]) -> tuple[list[Path], list[Problem]]:
    """Expand folders into their JSON/JSONL files (hidden entries skipped), sorted."""
    files: list[Path] = []
    problems: list[Problem] = []
    for path in paths:
        if path.is_dir():
            files.extend(
                sorted(
                    p
                    for p in path.rglob("*")
                    if p.is_file()
                    and p.suffix in DOCUMENT_SUFFIXES
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                )
            )
        elif path.is_file():
            files.append(path)
        else:
            problems.append(Problem(str(path), "", "no such file or folder"))
    return files, problems
