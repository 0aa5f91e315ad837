"""Model-level projection: what a faster kernel buys the model.

Per kernel of the Kernel Calling Record: its time per call under a solution is the workloads'
times weighted by how often each was captured (``count``). A solution counts only if it passed
every workload of its Definition. ``count × time per call`` for the baseline and for the best
such solution, and the kernel time the model would save. The baseline is by default the kernel
the engine ran (:mod:`fi_profile.replay.engine_kernel`); a kernel the replay has no solution of
has no baseline, and its row says what the engine ran instead of comparing with another kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fi_profile.replay.engine_kernel import ENGINE, engine_kernel
from fi_profile.replay.runner import REFERENCE, label_of
from fi_profile.schema import BenchmarkResult, Definition, KernelCallingRecord, Workload


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

    @property
    def saved_ms(self) -> float:
        if self.baseline_ms is None or self.best_ms is None:
            return 0.0
        return self.count * (self.baseline_ms - self.best_ms)


def per_call_ms(results: list[BenchmarkResult], workloads: list[Workload]) -> dict[str, float]:
    """Solution -> frequency-weighted time per call, for solutions that passed every workload."""
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
    total = sum(weights.values())
    return {
        source: sum(weights[w] * t for w, t in times.items()) / total
        for source, times in by_source.items()
        if source not in failed and set(times) == set(weights)
    }


def project(
    record: KernelCallingRecord,
    results: list[BenchmarkResult],
    workloads: dict[str, list[Workload]],
    baseline: Optional[str],
    definitions: Optional[dict[str, Definition]] = None,
) -> list[KernelProjection]:
    rows = []
    for kernel in record.kernels:
        times = per_call_ms([r for r in results if r.kernel_id == kernel.id], workloads.get(kernel.id, []))
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
            missing = f"the engine's kernel ({wanted}) did not pass every workload here"
        if base is None and baseline != ENGINE and REFERENCE in times:
            base = REFERENCE
        candidates = {s: t for s, t in times.items() if s != REFERENCE}
        best = min(candidates, key=candidates.__getitem__) if candidates else None
        rows.append(
            KernelProjection(
                kernel.id,
                kernel.count,
                base,
                times.get(base) if base else None,
                best,
                candidates.get(best) if best else None,
                missing,
            )
        )
    return rows
