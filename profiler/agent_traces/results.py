"""Benchmark Results beside a trace: which solutions a trace names, and how they fared."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from pydantic import ValidationError

from fi_profile.documents import iter_objects
from fi_profile.errors import Problem, problems_from_validation_error
from fi_profile.schema.benchmark_result import BenchmarkResult, Status


@dataclass(frozen=True)
class SolutionSummary:
    """One solution's results over the workloads it ran on."""

    name: str
    kernel_ids: tuple[str, ...]
    results: int
    passed: int
    statuses: tuple[str, ...]  # the statuses other than passed, most frequent first
    median_speedup: Optional[float]
    worst_max_diff: Optional[float]


def load_results(path: Path) -> tuple[list[BenchmarkResult], list[Problem]]:
    results, problems = [], []
    for item in iter_objects(path):
        if isinstance(item, Problem):
            problems.append(item)
            continue
        label, obj = item
        try:
            results.append(BenchmarkResult.model_validate(obj))
        except ValidationError as exc:
            problems.extend(problems_from_validation_error(label, exc))
    return results, problems


def summarize(results: Iterable[BenchmarkResult]) -> dict[str, SolutionSummary]:
    """Per solution (``source``); the reference run is not a solution a trace could name."""
    by_source: dict[str, list[BenchmarkResult]] = {}
    for r in results:
        if r.source != "reference":
            by_source.setdefault(r.source, []).append(r)
    summaries = {}
    for name, rs in by_source.items():
        ok = [r for r in rs if r.status in (None, Status.passed) and r.compiled]
        failed: dict[str, int] = {}
        for r in rs:
            if r not in ok:
                key = r.status.value if r.status else "compile_error"
                failed[key] = failed.get(key, 0) + 1
        speedups = [r.speedup for r in ok if r.speedup is not None]
        diffs = [r.max_diff for r in ok if r.max_diff is not None]
        summaries[name] = SolutionSummary(
            name=name,
            kernel_ids=tuple(sorted({r.kernel_id for r in rs})),
            results=len(rs),
            passed=len(ok),
            statuses=tuple(sorted(failed, key=lambda k: -failed[k])),
            median_speedup=statistics.median(speedups) if speedups else None,
            worst_max_diff=max(diffs) if diffs else None,
        )
    return summaries


def named_in(text: str, names: Iterable[str]) -> list[str]:
    """The solution names that occur in ``text`` as whole words (``rms_v1`` not in ``rms_v10``)."""
    return [n for n in names if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", text)]
