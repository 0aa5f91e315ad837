"""Replay past one host: each workload's pairs (its reference and every solution) one Ray task
with one GPU of the cluster (one CPU where the cluster has no GPU), results streamed back per
workload as they finish.

Inside its task a pair runs as it does locally, in a worker process with the pair's timeout (a
solution that hangs or crashes costs one result). A workload's pairs share a task so that its
reference and solutions are timed on the same GPU (speedups divide one by the other; a cluster's
GPUs need not be alike) and its inputs and reference outputs are drawn once. A task that dies
itself (its node lost, its process killed) is sent again as one task per pair, so that only the
pair that takes its task down is a ``crashed`` result; the run goes on. Ray places each task on a
GPU of its own, so no two pairs time on one GPU at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from fi_profile.replay.evaluate import Outcome, Task
from fi_profile.replay.worker import Worker

if TYPE_CHECKING:
    from fi_profile.replay.breakdown import TimeBreakdown
    from fi_profile.replay.runner import Group, ReplayOptions

#: this Ray worker process's replay worker, kept across tasks (its builds and JIT caches with it),
#: and the GPU it was started for
_WORKER: dict[str, Worker] = {}


def run_pair(task: Task, timeout_s: float) -> tuple[Outcome, dict]:
    """A Ray task: one pair on the GPU Ray gave it (``cuda:0`` of its visible devices), or the CPU."""
    from fi_profile.replay.runner import device_info

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    worker = _WORKER.get(visible)
    if worker is None:  # a worker process sees the GPUs visible when it started: one per GPU set
        for old in _WORKER.values():
            old.close()
        _WORKER.clear()
        worker = _WORKER[visible] = Worker()
    return worker.run(task, timeout_s), device_info(task.device).model_dump(exclude_none=True)


def run_pairs(tasks: list[Task], timeout_s: float) -> list[tuple[Outcome, dict]]:
    """A Ray task: one workload's pairs, in order, on the GPU Ray gave it."""
    return [run_pair(task, timeout_s) for task in tasks]


#: Ray's own output (its start-up lines, its processes' logs), beside results.jsonl: not over the progress display
RAY_LOG = "ray.log"


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Ray's logger and everything written to this process's stderr (file descriptor 2, which the
    Ray processes started here inherit) go to ``log`` while Ray starts."""
    log.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("ray")  # Ray's own handler writes to stderr: replaced by the log, for good
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    with open(log, "a") as file:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def run_on_ray(address: str, groups: list["Group"], options: "ReplayOptions", libs: dict[str, str],
               finished: Callable[["Group", list[dict]], None], report: Callable[[str, str], None],
               breakdown: "TimeBreakdown", log: Path) -> None:
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    from fi_profile.replay.runner import label_of, source_of
    from fi_profile.schema.benchmark_result import Device

    if not ray.is_initialized():
        with output_to(log):
            if address == "local":  # a cluster of this machine, started here and stopped with this process
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    # max_calls=0: Ray ends a GPU task's worker process after each task by default (max_calls=1),
    # which would start a fresh replay worker (CUDA context, imports, JIT loads) for every pair
    remote = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1, max_retries=0, max_calls=0)(run_pairs)
    device = "cuda:0" if gpus else "cpu"
    running: dict = {}  # task -> (group index, its solutions)
    left: dict[int, int] = {}
    fresh: dict[int, list[dict]] = {}

    def submit(index: int, solutions: list) -> None:
        # the pairs' own timeouts are enforced in the task, around each pair
        tasks = [groups[index].task(solution, device, options) for solution in solutions]
        running[remote.remote(tasks, options.timeout_s)] = (index, solutions)

    for index, group in enumerate(groups):
        todo = group.todo()
        if todo:
            left[index], fresh[index] = len(todo), []
            submit(index, todo)
    while running:
        ready, _ = ray.wait(list(running), num_returns=1)
        index, solutions = running.pop(ready[0])
        group = groups[index]
        try:
            returned = ray.get(ready[0], timeout=60)
        except (RayError, GetTimeoutError) as exc:
            if len(solutions) > 1:  # which pair took the task down is unknown: each again, alone
                for solution in solutions:
                    submit(index, [solution])
                continue
            returned = [(Outcome("crashed", error=f"the Ray task died ({type(exc).__name__}): {exc}"[:1000]), None)]
        for solution, (outcome, where) in zip(solutions, returned):
            # its phases: the task's own wait is not seen from here
            breakdown.add(outcome, None, label_of(source_of(solution)))
            info = Device.model_validate(where) if where else Device(name="unknown (the Ray task died)")
            fresh[index].append(group.result(solution, outcome, info, libs))
            report(info.name if gpus else "ray", source_of(solution))
            left[index] -= 1
        if left[index] == 0:
            finished(group, fresh.pop(index))
