"""Problems found in user files, reported as ``file: field.path: message``.

Schema models raise :class:`FieldErrors` from their cross-field validators so that every problem
keeps the exact path of the field it is about, even though pydantic itself only knows the path of
the validator that raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, Union

from pydantic import ValidationError

Loc = tuple[Union[str, int], ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one file. ``path`` is a dotted field path (may be empty)."""

    file: str
    path: str
    message: str
    warning: bool = False

    def __str__(self) -> str:
        kind = "warning: " if self.warning else ""
        where = f"{self.file}: {self.path}: " if self.path else f"{self.file}: "
        return f"{where}{kind}{self.message}"


class FieldErrors(ValueError):
    """Several errors, each at its own field path relative to the model that raised it."""

    def __init__(self, errors: Sequence[tuple[Loc, str]]):
        self.errors = list(errors)
        super().__init__("; ".join(f"{format_loc(loc)}: {msg}" for loc, msg in self.errors))


def format_loc(loc: Iterable[Union[str, int]]) -> str:
    return ".".join(str(part) for part in loc)


def problems_from_validation_error(
    file: str, exc: ValidationError, prefix: Loc = ()
) -> list[Problem]:
    """Flatten a pydantic error into problems, expanding :class:`FieldErrors` into their paths."""
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = prefix + tuple(_drop_union_tags(err["loc"]))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldErrors):
            for sub_loc, msg in cause.errors:
                problems.append(Problem(file, format_loc(loc + tuple(sub_loc)), msg))
            continue
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if err["type"] == "missing":
            msg = "field required"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field"
        problems.append(Problem(file, format_loc(loc), msg))
    return problems


_UNION_TAGS = {"const", "var", "random", "scalar", "safetensors", "llm_request", "tool_call", "mcp"}


def _drop_union_tags(loc: Loc) -> Loc:
    """Pydantic puts the tag of a discriminated union in the path (``axes.M.const.value``).

    Tags sit right after a key of ``axes``/``inputs`` or after the index of an agent-trace entry;
    only there are they dropped, so a tensor that is really named ``scalar`` keeps its name.
    """
    out: list[Union[str, int]] = []
    for i, part in enumerate(loc):
        after_map_key = i >= 2 and loc[i - 2] in ("axes", "inputs")
        after_root_index = i == 1 and isinstance(loc[0], int)
        if part in _UNION_TAGS and (after_map_key or after_root_index):
            continue
        out.append(part)
    return tuple(out)
