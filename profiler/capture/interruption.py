"""A capture stopped by a signal keeps what it recorded: SIGINT (Ctrl-C) and SIGTERM (``timeout``,
a batch scheduler's time limit) raise :class:`Interrupted` in the driver, which merges the parts its
engine processes saved (at most one ``--save-every`` interval lost), writes the record marked
incomplete, shuts the engine down and exits 128 + the signal (130, 143). A second signal while it
does so stops at once, saying where the saved parts are (``fi-profile recover`` makes the record)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal stopped the capture (a BaseException, as KeyboardInterrupt is: no engine code's
    ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        #: the record merged from what was saved (a ``CaptureSummary``), where anything was
        self.summary: Any = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def signals_interrupt(out_dir: Path, say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)
                      ) -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM raises :class:`Interrupted` in the main thread; a second
    one exits at once (its code 128 + the signal), saying what was kept (``say``: to the terminal)."""
    seen: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if seen:
            say(f"stopped at once by a second {signal.Signals(signum).name}; the parts saved so far are in "
                f"{out_dir / '.fi-profile' / 'parts'}: fi-profile recover {out_dir}")
            os._exit(128 + signum)
        seen.append(signum)
        raise Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s in SIGNALS:
            signal.signal(s, handler)
    except ValueError:  # not the main thread: signals stay as they were
        previous = {}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
