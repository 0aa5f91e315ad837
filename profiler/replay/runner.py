"""Replay every (workload × solution) of a dataset and write one Benchmark Result per pair.

Per workload the reference runs first (its time is what ``speedup`` divides), then each solution;
each in a worker process, with a timeout. With several devices, one worker per device takes the
next workload when it is free, of the Definition it is on while that has any (``DefinitionQueue``).
Results are appended to ``results.jsonl`` as each workload
finishes, so ``resume`` skips what is already there.
"""

from __future__ import annotations

import importlib.metadata
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from fi_profile.families import family_of
from fi_profile.replay.baseline_solutions import baseline_solutions
from fi_profile.replay.breakdown import TimeBreakdown
from fi_profile.replay.dataset import Dataset
from fi_profile.replay.engine_kernel import ENGINE, engine_kernel
from fi_profile.replay.evaluate import Outcome, Task
from fi_profile.replay.prewarm import Prewarm, order, warm_ups
from fi_profile.replay.trace_dataset import append_traces, write_dataset
from fi_profile.replay.worker import Worker
from fi_profile.replay.workload_size import largest
from fi_profile.schema import BenchmarkResult, Definition, Solution, Workload
from fi_profile.schema.benchmark_result import Device
from fi_profile.schema.solution import Language

REFERENCE = "reference"
LIBRARIES = ("torch", "triton", "vllm", "flashinfer-python", "sglang")


@dataclass
class ReplayOptions:
    device: str = "cuda:0" if torch.cuda.is_available() else "cpu"
    #: one worker per device, pairs spread over them (empty: ``device`` alone)
    devices: list[str] = field(default_factory=list)
    #: a Ray cluster's address, or ``local`` to start one: each workload's pairs a Ray task with one GPU
    ray: Optional[str] = None
    timeout_s: float = 120.0
    draws: int = 3
    #: the timed loop: at least ``min_time_s``, then until the median is known to ``precision``
    #: (relative standard error), at most ``max_time_s`` (:mod:`fi_profile.replay.stopping`)
    min_time_s: float = 0.0
    max_time_s: float = 0.1
    precision: float = 0.01
    cuda_graph: bool = False
    #: CUDA events around each call, or the call's own kernels' durations (as the engine's kernel
    #: accounting measures them): :data:`fi_profile.replay.timing.TIMERS`
    timer: str = "kernels"
    #: each call's per-step inputs read back into the L2 after the flush, as the engine leaves them
    warm_inputs: bool = False
    #: build what the pairs compile (FlashInfer JIT, Triton, torch.compile) in parallel up front
    #: (:mod:`fi_profile.replay.prewarm`); None: where the devices are GPUs
    prewarm: Optional[bool] = None
    baseline: Optional[str] = "torch"  # solution label (after "__") or name to compare against
    resume: bool = False


def device_info(device: str) -> Device:
    if not device.startswith("cuda"):
        return Device(name="cpu")
    index = torch.device(device).index or 0
    clock = None
    try:
        clock = int(torch.cuda.clock_rate(index))
    except Exception:  # needs pynvml; the clock is informative only
        pass
    return Device(name=torch.cuda.get_device_name(index), sm_clock_mhz=clock)


def library_versions() -> dict[str, str]:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def solutions_for(definition: Definition, given: list[Solution], with_baselines: bool) -> list[Solution]:
    chosen = [s for s in given if s.definition == definition.name]
    return chosen + (baseline_solutions(definition) if with_baselines else [])


def label_of(solution_name: str) -> str:
    """``rmsnorm_h4096__torch`` -> ``torch``; other names as they are."""
    return solution_name.rsplit("__", 1)[-1]


def read_results(path: Path) -> list[BenchmarkResult]:
    if not path.is_file():
        return []
    return [BenchmarkResult.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def not_replayed(definitions: Iterable[Definition]) -> dict[str, str]:
    """The Definitions no replay runs (their family's reason, such as a collective among GPUs), by name."""
    found = {}
    for definition in definitions:
        family = family_of(definition.op_type)
        if family is not None and family.not_replayed:
            found[definition.name] = family.not_replayed
    return found


def without_pairs(dataset: Dataset, results: Iterable[BenchmarkResult]) -> dict[str, str]:
    """The Definitions of ``dataset`` that the replay ran nothing of, by name, with why: their
    family's reason (:func:`not_replayed`), or no workload of them in the dataset."""
    ran = {result.kernel_id for result in results}
    reasons = not_replayed(dataset.definitions.values())
    found = {}
    for name in dataset.definitions:
        if name in ran:
            continue
        if name in reasons:
            found[name] = reasons[name]
        elif not dataset.workloads.get(name):
            found[name] = f"{dataset.root / 'workloads'} has no workload of it"
        else:
            found[name] = "no pair of it ran"
    return found


def replay(
    dataset: Dataset,
    solutions: list[Solution],
    with_baselines: bool,
    out_dir: Path,
    options: ReplayOptions,
    progress: Callable[[int, str, Optional[str]], None] = lambda advance, what, device=None: None,
    plan: Callable[[int], None] = lambda total: None,
) -> list[BenchmarkResult]:
    """Every pair, a workload's pairs together (speedups divide its reference's time): on one
    worker per device in ``options.devices`` (default: ``options.device``), each device running
    one pair at a time so that two pairs never time on one GPU at once; or, with ``options.ray``,
    as Ray tasks of one GPU each (:mod:`fi_profile.replay.ray_cluster`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.jsonl"
    previous = read_results(results_path) if options.resume else []
    if not options.resume:
        results_path.write_text("")
    done = {(r.kernel_id, r.workload, r.source): r.model_dump(mode="json", exclude_none=True) for r in previous}
    largest_of = {name: largest(definition, dataset.workloads.get(name, []))
                  for name, definition in dataset.definitions.items()}
    skipped = not_replayed(dataset.definitions.values())
    groups = [
        Group(dataset, definition, workload, [None, *solutions_for(definition, solutions, with_baselines)],
              {s: r for (k, w, s), r in done.items() if k == definition.name and w == workload.uuid},
              largest_of[definition.name])
        for definition in dataset.definitions.values() if definition.name not in skipped
        for workload in dataset.workloads.get(definition.name, [])
    ]
    write_dataset(out_dir, dataset, {d.name: solutions_for(d, solutions, with_baselines)
                                     for d in dataset.definitions.values() if d.name not in skipped})
    for group in groups:  # a resumed run's traces so far
        append_traces(out_dir, group.definition, group.workload,
                      [BenchmarkResult.model_validate(r) for r in group.by_source.values()])
    plan(sum(len(g.candidates) for g in groups))
    for group in groups:  # what a resumed run has already
        for source in group.by_source:
            progress(1, source)
    libs = library_versions()
    results = list(previous)
    lock = threading.Lock()
    breakdown, began = TimeBreakdown(), time.perf_counter()
    where = [f"ray {options.ray}"] if options.ray is not None else (options.devices or [options.device])

    def finished(group: Group, fresh: list[dict]) -> None:
        """A workload's new results, appended as one block once all its pairs are back."""
        baseline = options.baseline
        if baseline == ENGINE:  # per Definition, the kernel the captured engine ran (None where the replay lacks it)
            baseline = engine_kernel(dataset.record, group.definition).label
        _speedups(fresh, group.by_source, baseline)
        validated = [BenchmarkResult.model_validate(r) for r in fresh]
        with lock:
            with results_path.open("a") as f:
                for result in validated:
                    f.write(result.model_dump_json(exclude_none=True) + "\n")
            results.extend(validated)
            append_traces(out_dir, group.definition, group.workload, validated)
            breakdown.write(out_dir, time.perf_counter() - began, where)  # so far: a stopped run keeps it

    def report(device: str, source: str) -> None:
        with lock:
            progress(1, source, device)

    if options.ray is not None:
        from fi_profile.replay.ray_cluster import RAY_LOG, run_on_ray

        run_on_ray(options.ray, groups, options, libs, finished, report, breakdown, log=out_dir / RAY_LOG)
    else:
        warming = options.prewarm if options.prewarm is not None else all(d.startswith("cuda") for d in where)
        prewarm = Prewarm(warm_ups(groups, where[0], options) if warming else [], options.timeout_s)
        try:
            run_on_devices(where, order(groups), options, libs, finished, report, breakdown)
        finally:  # the pairs are done, or stopped: a warm-up still building is of no more use
            prewarm.stop()
            breakdown.prewarmed = (len(prewarm.tasks), dict(prewarm.failed), prewarm.cancelled)
            breakdown.write(out_dir, time.perf_counter() - began, where)
    if options.ray is not None:
        breakdown.write(out_dir, time.perf_counter() - began, where)
    return results


@dataclass
class Group:
    """One workload's pairs: the reference (``None``) and each solution; ``by_source`` holds the
    results it has (a resumed run's, then each new one)."""

    dataset: Dataset
    definition: Definition
    workload: Workload
    candidates: list[Optional[Solution]]
    by_source: dict[str, dict]
    #: the Definition's largest workload in this replay: a torch.compile'd solution is first called on it
    compile_first: Optional[Workload] = None

    def todo(self) -> list[Optional[Solution]]:
        return [s for s in self.candidates if source_of(s) not in self.by_source]

    def task(self, solution: Optional[Solution], device: str, options: ReplayOptions) -> Task:
        return Task(
            definition=self.definition.to_dict(),
            workload=self.workload.model_dump(mode="json", exclude_none=True),
            root=str(self.dataset.root),
            solution=None if solution is None else solution.model_dump(mode="json", exclude_none=True),
            device=device,
            draws=options.draws,
            min_time_s=options.min_time_s,
            max_time_s=options.max_time_s,
            precision=options.precision,
            cuda_graph=options.cuda_graph,
            timer=options.timer,
            warm_inputs=options.warm_inputs,
            compile_workload=(self.compile_first.model_dump(mode="json", exclude_none=True)
                              if self.compile_first is not None and solution is not None
                              and solution.spec.language is Language.torch_compile else None),
        )

    def result(self, solution: Optional[Solution], outcome: Outcome, device: Device, libs: dict[str, str]) -> dict:
        result = _result(self.definition, self.workload, solution, outcome, device, libs)
        self.by_source[source_of(solution)] = result
        return result


class DefinitionQueue:
    """The workloads left, by Definition. A device keeps to one Definition while it has workloads
    (its worker has built, compiled and JIT-loaded that Definition's solutions once), then takes
    one no device works on, else helps with the one that has the most left."""

    def __init__(self, groups: Iterable[Group]) -> None:
        self._left: dict[str, deque[Group]] = {}
        for group in groups:
            self._left.setdefault(group.definition.name, deque()).append(group)
        self._taken: Counter[str] = Counter()  # devices on each Definition
        self._lock = threading.Lock()

    def take(self, current: Optional[str]) -> Optional[Group]:
        with self._lock:
            if current is not None:
                self._taken[current] -= 1
            left = [name for name, queue in self._left.items() if queue]
            if not left:
                return None
            if current not in left:
                free = [name for name in left if not self._taken[name]]
                current = free[0] if free else max(left, key=lambda name: len(self._left[name]))
            self._taken[current] += 1
            return self._left[current].popleft()


def source_of(solution: Optional[Solution]) -> str:
    return REFERENCE if solution is None else solution.name


def run_on_devices(devices: list[str], groups: list[Group], options: ReplayOptions, libs: dict[str, str],
                   finished: Callable[[Group, list[dict]], None], report: Callable[[str, str], None],
                   breakdown: TimeBreakdown) -> None:
    """One thread and worker process per device; each takes the next workload when free.

    Stopped (a KeyboardInterrupt in the calling thread: Ctrl-C, or the SIGTERM a ``timeout`` sends,
    through :func:`fi_profile.capture.interruption.signals_interrupt`), it kills the workers, drops
    the workloads whose pairs had not all finished (their results would be the kill's), and
    re-raises: what ``finished`` wrote stays, and ``--resume`` goes on from there."""
    queue = DefinitionQueue(g for g in groups if g.todo())
    failures: list[BaseException] = []
    stopping = threading.Event()
    workers = [Worker() for _ in devices]  # one each, the same device named twice included

    def serve(device: str, worker: Worker) -> None:
        info = device_info(device)
        current: Optional[str] = None
        try:
            while not failures and not stopping.is_set():
                group = queue.take(current)
                if group is None:
                    return
                current = group.definition.name
                fresh = []
                for solution in group.todo():
                    waited = time.perf_counter()
                    outcome = worker.run(group.task(solution, device, options), options.timeout_s)
                    if stopping.is_set():  # killed by the stop: not this pair's outcome
                        return
                    breakdown.add(outcome, time.perf_counter() - waited, label_of(source_of(solution)))
                    fresh.append(group.result(solution, outcome, info, libs))
                    report(device, source_of(solution))
                finished(group, fresh)
        except BaseException as exc:  # noqa: BLE001 - re-raised once every device has stopped
            failures.append(exc)
        finally:
            worker.close()

    threads = [threading.Thread(target=serve, args=(d, w), name=f"replay {d}", daemon=True) for d, w in zip(devices, workers)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:
        stopping.set()
        for worker in workers:
            worker.kill()
        for thread in threads:
            thread.join(30)
        raise
    if failures:
        raise failures[0]


def _result(
    definition: Definition,
    workload: Workload,
    solution: Optional[Solution],
    outcome: Outcome,
    device: Device,
    libs: dict[str, str],
) -> dict:
    """The Benchmark Result's fields; ``speedup`` is filled once the workload's reference ran."""
    passed = outcome.status == "passed"
    fields = {
        "device": device.model_dump(exclude_none=True),
        "kernel_id": definition.name,
        "source": REFERENCE if solution is None else solution.name,
        "compiled": outcome.compiled,
        "compile_error": outcome.error if not outcome.compiled else None,
        "time": outcome.timing["median_ms"] if passed and outcome.timing else None,
        "max_diff": outcome.check["max_abs_diff"] if outcome.check else None,
        "workload": workload.uuid,
        "definition_op_type": definition.op_type,
        "status": outcome.status,
        "error": outcome.error if outcome.compiled else None,
        "check": outcome.check,
        "timing": outcome.timing,
        "libs": libs,
        "language": "reference" if solution is None else solution.spec.language.value,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _speedups(fresh: list[dict], by_source: dict[str, dict], baseline: Optional[str]) -> None:
    """``speedup``: the reference's time over this one (the seed's field; 1 for the reference);
    ``baseline_speedup``: the chosen baseline's time over this one. A passed result whose
    reference did not pass gets no speedup and is marked so."""
    reference = by_source.get(REFERENCE, {})
    base = next(
        (r for s, r in by_source.items() if baseline and (s == baseline or label_of(s) == baseline) and r.get("time")),
        None,
    )
    for result in fresh:
        time = result.get("time")
        if not time:
            continue
        if reference.get("time"):
            result["speedup"] = reference["time"] / time
            result["reference_time"] = reference["time"]
        else:
            result["status"] = "runtime_error"
            result["error"] = "passed, but the reference did not run here, so there is nothing to compare with"
            result.pop("time")
            continue
        if base is not None:
            result["baseline"] = base["source"]
            result["baseline_speedup"] = base["time"] / time
