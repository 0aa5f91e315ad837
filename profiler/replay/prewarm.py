"""Build and compile, up front and in parallel, what a replay's pairs will need once each.

On a cold host most of a replay's time is first calls: FlashInfer compiles each module it needs
with nvcc, Triton and torch.compile compile theirs, one after another inside the one worker of a
device (on an H100 a cold 8B capture spent 174 s of 324 s there). These caches live on disk
(FlashInfer's JIT folder, Triton's and Inductor's caches), so a solution built in another process
is found built by the device's worker. Before the pairs start, one warm-up task per (Definition,
solution that compiles) runs in a pool of worker processes of its own: the build and one untimed
call on the Definition's smallest workload (small inputs, a cheap reference), nothing timed; a
``torch.compile``'d solution is called on the largest first, as in every process (the shapes
Inductor compiles and autotunes for: ``Task.compile_workload``).
Meanwhile the devices start with the Definitions that need no such build (:func:`order`).

A warm-up's small calls share the GPU with the pairs being timed there; its builds are host work."""

from __future__ import annotations

import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from fi_profile.replay.worker import Worker
from fi_profile.replay.workload_size import input_size
from fi_profile.schema import Solution

if TYPE_CHECKING:
    from fi_profile.replay.runner import Group, ReplayOptions

#: solution labels whose first call builds or compiles something kept on disk
COMPILED_LABELS = ("flashinfer", "torch_compile")
COMPILED_LANGUAGES = ("triton", "cuda", "torch_compile")


def compiles(solution: Optional[Solution]) -> bool:
    if solution is None:
        return False
    return solution.name.rsplit("__", 1)[-1] in COMPILED_LABELS or solution.spec.language.value in COMPILED_LANGUAGES


def order(groups: list["Group"]) -> list["Group"]:
    """The groups with the Definitions that need no build first (stable otherwise)."""
    return sorted(groups, key=lambda g: any(compiles(s) for s in g.candidates))


def warm_ups(groups: list["Group"], device: str, options: "ReplayOptions") -> list:
    """One warm-up task per (Definition, solution that compiles), on the smallest workload left."""
    smallest: dict[str, tuple[float, "Group"]] = {}
    for group in groups:
        if not group.todo():
            continue
        size = input_size(group.definition, group.workload.axes)
        if group.definition.name not in smallest or size < smallest[group.definition.name][0]:
            smallest[group.definition.name] = (size, group)
    tasks = []
    for _, group in smallest.values():
        for solution in group.todo():
            if compiles(solution):
                tasks.append(replace(group.task(solution, device, options), draws=1, warm_only=True))
    return tasks


class Prewarm:
    """The warm-up tasks running in the background (``workers`` processes). ``stop`` ends them once
    the pairs are done (or stopped): a warm-up still building then would only delay the results,
    so it is killed and those not begun are dropped (``cancelled``). ``failed`` counts those that
    did not pass by how they ended (``timeout``: a build longer than the limit, killed; its pair
    builds again)."""

    def __init__(self, tasks: list, timeout_s: float, workers: Optional[int] = None) -> None:
        self.tasks = tasks
        self.failed: Counter[str] = Counter()
        self.cancelled = 0
        self._stopping = threading.Event()
        self._made: list[Worker] = []
        self._made_lock = threading.Lock()
        self._workers = max(1, min(len(tasks), workers or max(1, (os.cpu_count() or 2) // 2), 8))
        self._thread = threading.Thread(target=self._run, args=(timeout_s,), name="fi-profile prewarm", daemon=True)
        if tasks:
            self._thread.start()

    def _run(self, timeout_s: float) -> None:
        local = threading.local()

        def warm(task) -> None:
            with self._made_lock:
                if self._stopping.is_set():
                    self.cancelled += 1
                    return
                if not hasattr(local, "worker"):
                    local.worker = Worker()
                    self._made.append(local.worker)
            status = local.worker.run(task, timeout_s).status
            if self._stopping.is_set():  # killed by ``stop``: not a failure of the build
                self.cancelled += 1
            elif status != "passed":
                self.failed[status] += 1

        try:
            with ThreadPoolExecutor(self._workers, thread_name_prefix="fi-profile prewarm") as pool:
                list(pool.map(warm, self.tasks))
        finally:
            self._close_workers()

    def _close_workers(self) -> None:
        with self._made_lock:
            made, self._made = self._made, []
        for worker in made:
            worker.kill()

    def join(self) -> None:
        """Wait for every warm-up to end."""
        if self.tasks:
            self._thread.join()

    def stop(self) -> None:
        """Drop the warm-ups not begun, kill those running, and wait for the pool to end."""
        self._stopping.set()
        self._close_workers()
        self.join()
