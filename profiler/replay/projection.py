"""Model-level projection: what a faster kernel buys the model.

Per kernel of the Kernel Calling Record: its time per call under a solution is the workloads'
times weighted by how often each was captured (``count``); workloads a replay did not run (told
``--max-workloads``) count with a time estimated from those it ran, by their inputs' size, so that
rare large calls (a long prefill) weigh what they weigh in the capture. A solution counts only if it passed
every workload of its Definition. ``count × time per call`` for the baseline and for the best
such solution, and the kernel time the model would save. The baseline is by default the kernel
the engine ran (:mod:`fi_profile.replay.engine_kernel`); a kernel the replay has no solution of
has no baseline, and its row says what the engine ran instead of comparing with another kernel.

Where the capture measured the engine's own kernels (``run.engine_kernels``), the engine-baseline
projection is set beside that measurement (:func:`against_measurement`): a projection that does
not match what the engine spent says where it cannot be trusted."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Optional, Sequence

from fi_profile.replay.engine_kernel import ENGINE, engine_kernel
from fi_profile.replay.runner import REFERENCE, label_of
from fi_profile.replay.workload_size import input_size
from fi_profile.schema import BenchmarkResult, Definition, KernelCallingRecord, Workload
from fi_profile.schema.run_info import EngineKernels, UnkeptWorkload


@dataclass
class KernelProjection:
    kernel: str
    count: int
    baseline: Optional[str]
    baseline_ms: Optional[float]  # per call
    best: Optional[str]
    best_ms: Optional[float]
    #: why there is no baseline (the engine's kernel, not among the replayed solutions), or None
    missing: Optional[str] = None
    #: the GPU's SM clock the baseline was timed at (its timed workloads', weighed by their counts)
    baseline_mhz: Optional[float] = None

    @property
    def saved_ms(self) -> float:
        if self.baseline_ms is None or self.best_ms is None:
            return 0.0
        return self.count * (self.baseline_ms - self.best_ms)


def per_call_ms(results: list[BenchmarkResult], workloads: list[Workload],
                definition: Optional[Definition] = None,
                unkept: Sequence[UnkeptWorkload] = ()) -> dict[str, float]:
    """Solution -> frequency-weighted time per call, for solutions that passed every workload they
    ran. With ``definition``, workloads a solution did not run (a replay told ``--max-workloads``)
    stand in with a time estimated from the ones it ran, by their inputs' size
    (:func:`estimated_ms`), and so do the shapes the capture saw but did not write (``unkept``:
    ``run.unkept_workloads``); without it, a solution must have run every workload."""
    weights = {w.uuid: float(w.count or 1) for w in workloads}
    by_source: dict[str, dict[str, float]] = {}
    failed: set[str] = set()
    for r in results:
        if r.workload not in weights:
            continue
        if r.time is None:
            failed.add(r.source)
        else:
            by_source.setdefault(r.source, {})[r.workload] = r.time
    sizes = {w.uuid: input_size(definition, w.axes) for w in workloads} if definition is not None else {}
    others = [(input_size(definition, u.axes), float(u.count)) for u in unkept] if definition is not None else []
    total = sum(weights.values()) + sum(count for _, count in others)
    found = {}
    for source, times in by_source.items():
        if source in failed or (not sizes and set(times) != set(weights)):
            continue
        kept = sum(weights[w] * (times[w] if w in times else estimated_ms(sizes[w], sizes, times)) for w in weights)
        found[source] = (kept + sum(count * estimated_ms(size, sizes, times) for size, count in others)) / total
    return found


def timed_clock_mhz(results: list[BenchmarkResult], workloads: list[Workload], source: str) -> Optional[float]:
    """The SM clock ``source`` was timed at over the workloads it ran, weighed by their counts (None:
    no clock sampled)."""
    weights = {w.uuid: float(w.count or 1) for w in workloads}
    return _weighed([(weights[r.workload], r.timing.sm_clock_mhz) for r in results
                     if r.source == source and r.workload in weights and r.timing is not None])


def estimated_ms(size: float, sizes: dict[str, float], times: dict[str, float]) -> float:
    """A workload's time from the timed ones of its Definition, by input size: linear between the
    nearest smaller and larger, the smallest's below them (a small call costs its launch), growing
    in proportion above them (a large one its work)."""
    timed = sorted((sizes[w], t) for w, t in times.items())
    if size <= timed[0][0]:
        return timed[0][1]
    if size >= timed[-1][0]:
        return timed[-1][1] * size / timed[-1][0] if timed[-1][0] > 0 else timed[-1][1]
    i = bisect.bisect_left([s for s, _ in timed], size)
    (s0, t0), (s1, t1) = timed[i - 1], timed[i]
    return t0 + (t1 - t0) * (size - s0) / (s1 - s0) if s1 > s0 else t1


def project(
    record: KernelCallingRecord,
    results: list[BenchmarkResult],
    workloads: dict[str, list[Workload]],
    baseline: Optional[str],
    definitions: Optional[dict[str, Definition]] = None,
) -> list[KernelProjection]:
    rows = []
    #: solutions that compute only some outputs (``spec.computes``): a baseline, never a candidate to replace it
    partial = {r.source for r in results if r.check is not None and r.check.unchecked}
    unkept = (record.run.unkept_workloads if record.run is not None else None) or {}
    for kernel in record.kernels:
        times = per_call_ms([r for r in results if r.kernel_id == kernel.id], workloads.get(kernel.id, []),
                            (definitions or {}).get(kernel.id), unkept.get(kernel.id, ()))
        missing = None
        wanted = baseline
        if baseline == ENGINE:
            definition = (definitions or {}).get(kernel.id)
            engine = engine_kernel(record, definition) if definition is not None else None
            wanted = engine.label if engine is not None else None
            if wanted is None:
                missing = engine.what if engine is not None else "its Definition is not in the dataset"
        base = next((s for s in times if wanted and (s == wanted or label_of(s) == wanted)), None)
        if base is None and wanted is not None and missing is None:
            missing = _why_not(wanted, [r for r in results if r.kernel_id == kernel.id])
        if base is None and baseline != ENGINE and REFERENCE in times:
            base = REFERENCE
        candidates = {s: t for s, t in times.items() if s != REFERENCE and s not in partial}
        best = min(candidates, key=candidates.__getitem__) if candidates else None
        if base is not None and (best is None or candidates[best] > times[base]):
            best = base  # no whole candidate beats the baseline (one computing some outputs): it stays, saving 0
            candidates[base] = times[base]
        own = [r for r in results if r.kernel_id == kernel.id]
        rows.append(
            KernelProjection(
                kernel.id,
                kernel.count,
                base,
                times.get(base) if base else None,
                best,
                candidates.get(best) if best else None,
                missing,
                timed_clock_mhz(own, workloads.get(kernel.id, []), base) if base else None,
            )
        )
    return rows


def _why_not(label: str, results: list[BenchmarkResult]) -> str:
    """Why the engine's kernel (``label``) is no baseline of a Definition's results."""
    if not results:
        return f"no pair of this Definition ran (the engine's kernel: {label})"
    if any(label in (r.source, label_of(r.source)) for r in results):
        return f"the engine's kernel ({label}) did not pass every workload here"
    if results and all(r.device.name == "cpu" for r in results):
        return f"the engine's kernel ({label}) was not run: the engines' natives run on CUDA only"
    return f"the engine's kernel ({label}) was not among the solutions replayed"


@dataclass
class MeasuredRow:
    """The projection of Definitions beside what the engine's kernels took for them in the capture
    (``run.engine_kernels``): one Definition, or those one kernel computed together."""

    kernels: tuple[str, ...]
    calls: int
    measured_ms: float
    #: the captured counts × the replayed time of the kernel the engine ran (None: not replayed)
    projected_ms: Optional[float]
    #: the engine's kernel as the replay labels it, or why the projection has none
    engine: str
    #: what the best candidate that passed would save against the engine's kernel
    saved_ms: float
    #: the SM clock the engine's kernels ran at (the capture's) and the replay timed them at (MHz)
    engine_mhz: Optional[float] = None
    replay_mhz: Optional[float] = None

    @property
    def ratio(self) -> Optional[float]:
        return self.projected_ms / self.measured_ms if self.projected_ms is not None and self.measured_ms > 0 else None

    @property
    def at_engine_clock_ms(self) -> Optional[float]:
        """The projection with its replayed times scaled from the replay's SM clock to the engine's
        (× replay MHz / engine MHz), as a kernel bound by its SM clock would take: the most the
        clocks explain (a kernel bound by memory slows less). None where either clock is unknown."""
        if self.projected_ms is None or not self.engine_mhz or not self.replay_mhz:
            return None
        return self.projected_ms * self.replay_mhz / self.engine_mhz

    @property
    def ratio_at_engine_clock(self) -> Optional[float]:
        """:attr:`ratio` with the replayed times at the engine's clock (None: a clock unknown)."""
        scaled = self.at_engine_clock_ms
        return scaled / self.measured_ms if scaled is not None and self.measured_ms > 0 else None


def against_measurement(rows: list[KernelProjection], kernels: EngineKernels) -> list[MeasuredRow]:
    """Each row of an engine-baseline projection beside the engine's measured time; Definitions
    measured together (``shared_with``) are one row, projected as the sum of theirs."""
    by_kernel = {row.kernel: row for row in rows}
    groups: list[set[str]] = []
    for name, measured in kernels.by_definition.items():
        group = {name, *(measured.shared_with or ())}
        joined = [g for g in groups if g & group]
        for g in joined:
            groups.remove(g)
            group |= g
        groups.append(group)
    found = []
    for group in groups:
        names = tuple(sorted(group, key=lambda n: -(by_kernel[n].count if n in by_kernel else 0)))
        projections = [by_kernel.get(n) for n in names]
        complete = all(p is not None and p.baseline_ms is not None for p in projections)
        projected = sum(p.count * p.baseline_ms for p in projections) if complete else None  # type: ignore[union-attr,operator]
        engine = ", ".join(sorted({label_of(p.baseline) if p is not None and p.baseline else
                                   (p.missing if p is not None and p.missing else "not replayed") for p in projections}))
        measured = [kernels.by_definition[n] for n in names if n in kernels.by_definition]
        found.append(MeasuredRow(
            names,
            sum(p.count for p in projections if p is not None),
            sum(m.ms for m in measured),
            projected,
            engine,
            sum(p.saved_ms for p in projections if p is not None),
            _weighed([(m.ms, m.sm_clock_mhz) for m in measured]),
            _weighed([(p.count * p.baseline_ms, p.baseline_mhz) for p in projections
                      if p is not None and p.baseline_ms is not None]),
        ))
    return sorted(found, key=lambda r: -r.measured_ms)


def _weighed(pairs: Sequence[tuple[float, Optional[float]]]) -> Optional[float]:
    """The mean of the known values, weighed (None: none known)."""
    known = [(w, v) for w, v in pairs if v is not None and w > 0]
    total = sum(w for w, _ in known)
    return sum(w * v for w, v in known) / total if total else None
