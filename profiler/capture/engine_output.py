"""Where the engines' own output goes during a capture, and the live progress line beside it.

The engines log hundreds of lines (start-up, warnings with tracebacks, CUDA-graph capture progress
bars), from this process and from the processes they start. :func:`engine_output_to` points file
descriptors 1 and 2 at ``DIR/engine.log`` for the engine's lifetime, so every process the engine
starts inherits that, and hands back a console on the real terminal for fi-profile's own lines.
:class:`ProgressLine` shows steps, tokens and calls as the engine processes report them
(``.fi-profile/progress/<pid>.json``, written by each recorder at most twice a second).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

from rich.console import Console

from fi_profile.capture.recorder import PROGRESS_DIR

#: the engine's own output, in the capture's folder
ENGINE_LOG = "engine.log"


@contextlib.contextmanager
def engine_output_to(log: Optional[Path]) -> Iterator[Console]:
    """While open, fds 1 and 2 (this process's and every child's) write to ``log``; yields a
    console on the terminal as it was. ``log=None`` changes nothing (``--verbose``)."""
    if log is None:
        yield Console()
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        with open(log, "wb", buffering=0) as sink:  # a fresh log per capture
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield Console(file=terminal)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        terminal.close()
        for fd in saved:
            os.close(fd)


def read_progress(out_dir: Path) -> Optional[dict[str, int]]:
    """Steps, tokens and calls summed over the engine processes; None before any reported."""
    total = {"steps": 0, "tokens": 0, "calls": 0}
    found = False
    for path in (out_dir / PROGRESS_DIR).glob("*.json"):
        try:
            part = json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced right now: next time
            continue
        found = True
        for key in total:
            total[key] += int(part.get(key, 0))
    return total if found else None


class ProgressLine:
    """A live status line on ``console`` until closed: the engine starting, then what it has run."""

    def __init__(self, console: Console, out_dir: Path, what: str, log: Optional[Path]) -> None:
        self.console, self.out_dir, self.what, self.log = console, out_dir, what, log
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._status = console.status(self._text(None), spinner="dots")
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _text(self, progress: Optional[dict[str, int]]) -> str:
        elapsed = f"{time.monotonic() - self.started:.0f} s"
        log = f" (engine output: {self.log})" if self.log else ""
        if progress is None:
            return f"{self.what}: starting the engine, {elapsed}{log}"
        return (f"{self.what}: {progress['steps']:,} steps, {progress['tokens']:,} tokens, "
                f"{progress['calls']:,} kernel calls recorded, {elapsed}{log}")

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._status.update(self._text(read_progress(self.out_dir)))

    def __enter__(self) -> "ProgressLine":
        self._status.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._status.stop()
        progress = read_progress(self.out_dir)
        if progress is not None:
            self.console.print(self._text(progress).replace(self.what + ":", f"{self.what} done:", 1), highlight=False)
