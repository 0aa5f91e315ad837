"""Replay past one host: each (workload, solution) pair a Ray task with one GPU of the cluster
(one CPU where the cluster has no GPU), results streamed back as they finish.

Inside its task a pair runs as it does locally, in a worker process with the pair's timeout (a
solution that hangs or crashes costs one result); a task that dies itself (its node lost, its
process killed) is a ``crashed`` result, and the run goes on. Ray places each task on a GPU of its
own, so no two pairs time on one GPU at once. A workload's results are written together once its
last pair is back (speedups divide its reference's time).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Optional

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


def run_on_ray(address: str, groups: list["Group"], options: "ReplayOptions", libs: dict[str, str],
               finished: Callable[["Group", list[dict]], None], report: Callable[[str, str], None],
               breakdown: "TimeBreakdown") -> None:
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    from fi_profile.replay.runner import label_of, source_of
    from fi_profile.schema.benchmark_result import Device

    if not ray.is_initialized():
        if address == "local":  # a cluster of this machine, started here and stopped with this process
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    # max_calls=0: Ray ends a GPU task's worker process after each task by default (max_calls=1),
    # which would start a fresh replay worker (CUDA context, imports, JIT loads) for every pair
    remote = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1, max_retries=0, max_calls=0)(run_pair)
    device = "cuda:0" if gpus else "cpu"
    running: dict = {}
    left: dict[int, int] = {}
    fresh: dict[int, list[dict]] = {}
    for index, group in enumerate(groups):
        todo = group.todo()
        if not todo:
            continue
        left[index], fresh[index] = len(todo), []
        for solution in todo:
            # a generous wait: the pair's own timeout is enforced in its task, around the pair only
            running[remote.remote(group.task(solution, device, options), options.timeout_s)] = (index, solution)
    while running:
        ready, _ = ray.wait(list(running), num_returns=1)
        ref = ready[0]
        index, solution = running.pop(ref)
        group = groups[index]
        where: Optional[dict] = None
        try:
            outcome, where = ray.get(ref, timeout=60)
        except (RayError, GetTimeoutError) as exc:
            outcome = Outcome("crashed", error=f"the Ray task died ({type(exc).__name__}): {exc}"[:1000])
        # its phases: the task's own wait is not seen from here
        breakdown.add(outcome, label=label_of(source_of(solution)))
        info = Device.model_validate(where) if where else Device(name="unknown (the Ray task died)")
        fresh[index].append(group.result(solution, outcome, info, libs))
        report(info.name if gpus else "ray", source_of(solution))
        left[index] -= 1
        if left[index] == 0:
            finished(group, fresh.pop(index))
