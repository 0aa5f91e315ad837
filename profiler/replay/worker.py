"""Solutions run in a spawned worker process, one at a time, so that a crash, a hang or a broken
CUDA context costs one result, not the run: the parent waits with a timeout, records what
happened and starts a fresh worker."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Optional

from fi_profile.replay.evaluate import Outcome, Task


def _serve(conn: Connection) -> None:
    from fi_profile.replay.evaluate import evaluate

    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        conn.send(evaluate(task))


class Worker:
    def __init__(self) -> None:
        self._process: Optional[mp.process.BaseProcess] = None
        self._conn: Optional[Connection] = None

    def _start(self) -> None:
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True, name="fi-profile-replay")
        self._process.start()
        child.close()

    def run(self, task: Task, timeout_s: float) -> Outcome:
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._conn is not None and self._process is not None
        self._conn.send(task)
        if not self._conn.poll(timeout_s):
            self._process.kill()  # hung: no point waiting for it to read EOF
            self.close()
            return Outcome("timeout", error=f"no result within {timeout_s:g} s; the worker was killed")
        try:
            outcome: Outcome = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._process.join(5)
            code = self._process.exitcode
            self.close()
            return Outcome("crashed", error=f"the worker process died (exit code {code}) while running it")
        if outcome.restart:
            self.close()
        return outcome

    def kill(self) -> None:
        """Stop the worker now, whatever it is running (a ``run`` waiting on it then returns
        ``crashed``)."""
        process = self._process
        if process is not None and process.is_alive():
            process.kill()

    def close(self) -> None:
        """Stop the worker: closing the pipe ends its loop; one that does not end is killed."""
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            self._process.join(2)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        self._process, self._conn = None, None
