"""Read an agent trace file in any of its forms into the seed's typed list.

Forms, told apart by content: the typed list (a JSON array of entries with ``type``; or JSONL, one
entry per line), a seed conversation object (``model``, ``conversation``), and an
OpenAI-compatible request/response log (JSONL, one ``{"request": ..., "response": ...}`` per line).
Every problem names the file (and line) and the field, in the form of the file as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from fi_profile.agent_traces.convert import entries_from_conversation, entries_from_log
from fi_profile.agent_traces.openai_format import FormatError
from fi_profile.documents import iter_objects
from fi_profile.errors import Problem, problems_from_validation_error
from fi_profile.schema.agent_trace import AgentConversation, AgentTrace, LLMRequestEntry

FORMS = ("typed list", "conversation", "request/response log")


class TraceError(ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class LoadedTrace:
    path: Path
    form: str
    trace: AgentTrace


_ENTRY = TypeAdapter(LLMRequestEntry)


def load_trace(path: Path) -> LoadedTrace:
    objects = list(iter_objects(path))
    broken = [o for o in objects if isinstance(o, Problem)]
    if broken:
        raise TraceError(broken)
    if not objects:
        raise TraceError([Problem(str(path), "", "empty file: no trace in it")])
    label, first = objects[0]
    if path.suffix == ".jsonl" and isinstance(first, dict) and "request" in first:
        return LoadedTrace(path, "request/response log", _from_log(objects))
    if path.suffix == ".jsonl":
        return LoadedTrace(path, "typed list", _validated(str(path), [obj for _, obj in objects]))
    if isinstance(first, dict) and "conversation" in first and "type" not in first:
        try:
            conversation = AgentConversation.model_validate(first)
        except ValidationError as exc:
            raise TraceError(problems_from_validation_error(label, exc)) from None
        entries = entries_from_conversation(conversation.model_dump(mode="json", exclude_none=True))
        return LoadedTrace(path, "conversation", _validated(label, entries))
    if isinstance(first, list):
        return LoadedTrace(path, "typed list", _validated(label, first))
    raise TraceError([Problem(label, "", f"not an agent trace: expected one of the forms {', '.join(FORMS)}")])


def _validated(label: str, entries: list[Any]) -> AgentTrace:
    try:
        return AgentTrace.model_validate(entries)
    except ValidationError as exc:
        raise TraceError(problems_from_validation_error(label, exc)) from None


def _from_log(objects: list[tuple[str, Any]]) -> AgentTrace:
    try:
        entries = entries_from_log(objects)
    except FormatError as exc:
        label, _, field = exc.path.partition(": ")
        raise TraceError([Problem(label, field, str(exc).removeprefix(f"{exc.path}: "))]) from None
    problems = []
    requests = [e for e in entries if e["type"] == "llm_request"]
    for (label, _), entry in zip(objects, requests):  # one request per line, in order
        try:
            _ENTRY.validate_python(entry)
        except ValidationError as exc:
            for problem in problems_from_validation_error(label, exc):
                field = problem.path.replace("conversation.", "request.messages.", 1)
                problems.append(Problem(label, field, problem.message))
    if problems:
        raise TraceError(problems)
    return AgentTrace.model_validate(entries)
