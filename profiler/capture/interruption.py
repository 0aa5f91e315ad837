"""A capture stopped by a signal keeps what it recorded: SIGINT (Ctrl-C) and SIGTERM (``timeout``,
a batch scheduler's time limit) raise :class:`Interrupted` in the driver, which asks its engine's
processes to save the steps they finished and merges their parts (where they cannot, what they
saved before: at most one ``--save-every`` interval lost), writes the record marked
incomplete, shuts the engine down and exits 128 + the signal (130, 143). A second signal while it
does so stops at once, saying where the saved parts are (``fi-profile recover`` makes the record).
A replay is stopped the same way: it keeps the results of the workloads it finished and reports on them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: seconds within which the same signal again is the first one's echo (``timeout`` sends it twice)
ECHO_S = 2.0


class Interrupted(KeyboardInterrupt):
    """A signal stopped the capture: a KeyboardInterrupt, which no engine code's ``except
    Exception`` swallows and asyncio's event loop lets out (SGLang generates in one: another
    BaseException raised there ended the task that reads the scheduler's replies, and the capture
    hung)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        #: the record merged from what was saved (a ``CaptureSummary``), where anything was
        self.summary: Any = None
        #: why the engine did not save at the signal (it did not answer): its processes are killed,
        #: not shut down, and the driver exits without its teardown (which may wait on that answer)
        self.unanswered: Optional[str] = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def signals_interrupt(out_dir: Path, say: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
                      kept: Optional[str] = None) -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM raises :class:`Interrupted` in the main thread; a second
    one exits at once (its code 128 + the signal), saying what was kept (``say``: to the terminal;
    ``kept``: what to say of it, by default a capture's saved parts under ``out_dir``).
    The same signal again within :data:`ECHO_S` of the first is that signal's echo, not a second
    one: GNU ``timeout`` signals its command and then its own process group, fi-profile in it."""
    kept = kept or (f"the parts saved so far are in {out_dir / '.fi-profile' / 'parts'}: "
                    f"fi-profile recover {out_dir}")
    seen: list[tuple[int, float]] = []

    def handler(signum: int, frame: object) -> None:
        if seen:
            first, at = seen[0]
            if signum == first and time.monotonic() - at < ECHO_S:
                return
            say(f"stopped at once by a second {signal.Signals(signum).name}; {kept}")
            os._exit(128 + signum)
        seen.append((signum, time.monotonic()))
        global _STOPPING
        _STOPPING = True
        raise Interrupted(signum)

    global _HANDLER, _STOPPING
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s in SIGNALS:
            signal.signal(s, handler)
    except ValueError:  # not the main thread: signals stay as they were
        previous = {}
    outer, _HANDLER = _HANDLER, handler if previous else None
    try:
        yield
    finally:
        _HANDLER, _STOPPING = outer, False
        for s, h in previous.items():
            signal.signal(s, h)


#: the handler :func:`signals_interrupt` installed, while it is in effect
_HANDLER: Optional[Callable[[int, Any], None]] = None
#: a first signal was taken: the capture is stopping (:func:`stopping`)
_STOPPING = False


def stopping() -> bool:
    """Whether a signal is stopping the capture: an engine process that dies now may have been sent
    the same signal (a process group signalled), and is no failure of the engine's."""
    return _STOPPING


def reclaim_signals() -> None:
    """Within :func:`signals_interrupt`: its handler again, for an engine that installed its own
    meanwhile (SGLang's tokenizer manager takes SIGTERM to drain every request, at its first
    request: a SIGTERM then ended the capture only once all of them were done)."""
    if _HANDLER is not None:
        for s in SIGNALS:
            signal.signal(s, _HANDLER)
