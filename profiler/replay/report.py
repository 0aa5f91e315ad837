"""The tables a replay prints: one line per Definition (its best solution), the per-Definition
detail (``--verbose``), and the model-level projections. Every name is shown whole at any width
(:mod:`fi_profile.readable_table`)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Mapping, Optional

from rich.console import Console

from fi_profile.readable_table import Notes, print_table
from fi_profile.replay.projection import KernelProjection, MeasuredRow
from fi_profile.replay.runner import REFERENCE, label_of
from fi_profile.replay.throughput import peak, tflops
from fi_profile.schema import BenchmarkResult, Definition, KernelCallingRecord


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _throughput(rs: list[BenchmarkResult], definition: Optional[Definition],
                workload_axes: Mapping[str, Mapping[str, int]]) -> tuple[str, str]:
    """The median TFLOP/s of a solution's passed results, and its share of the card's peak."""
    if definition is None:
        return "", ""
    rates = sorted(rate for r in rs if r.time is not None and r.workload in workload_axes
                   for rate in [tflops(definition, workload_axes[r.workload], r.time)] if rate is not None)
    if not rates:
        return "", ""
    rate = rates[len(rates) // 2]
    roof = peak(rs[0].device.name, definition)
    return f"{rate:.1f}", f"{100 * rate / roof:.0f}%" if roof else ""


def _by_definition(results: list[BenchmarkResult]) -> dict[str, dict[str, list[BenchmarkResult]]]:
    """Definition -> solution -> its results, in the results' order."""
    grouped: dict[str, dict[str, list[BenchmarkResult]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        grouped[r.kernel_id][r.source].append(r)
    return grouped


def _median_ms(rs: list[BenchmarkResult]) -> Optional[float]:
    passed = sorted(r.time for r in rs if r.time is not None)
    return passed[len(passed) // 2] if passed else None


def _speedup(rs: list[BenchmarkResult], baseline: bool = False) -> Optional[float]:
    values = [r.baseline_speedup if baseline else r.speedup for r in rs if r.time is not None]
    values = [v for v in values if v]
    return _geomean(values) if values else None


def timed_by(results: list[BenchmarkResult]) -> str:
    """How the results' times were taken (``timing.method``: ``cupti_kernels``, ``cuda_events`` where
    CUPTI linked no kernel to a call, ``cpu_wall``), for a table's title."""
    methods = sorted({r.timing.method for r in results if r.timing is not None})
    return f"timed by {', '.join(methods)}" if methods else "not timed"


def _x(value: Optional[float]) -> str:
    return f"{value:.2f}" if value is not None else "-"


def print_best(console: Console, results: list[BenchmarkResult]) -> None:
    """One row per Definition: how many solutions passed all its workloads, and the fastest of
    them (the highest geometric-mean speedup over the reference) with its speedups."""
    device = results[0].device.name if results else "?"
    rows, notes = [], Notes()
    for name, by_source in _by_definition(results).items():
        workloads = {r.workload for rs in by_source.values() for r in rs}
        candidates = {source: rs for source, rs in by_source.items() if source != REFERENCE}
        whole = {source: rs for source, rs in candidates.items() if all(r.time is not None for r in rs)}
        best = max(whole, key=lambda source: _speedup(whole[source]) or 0.0) if whole else None
        failed = sorted({f"{label_of(source)} {r.status.value}{_why(r)}" for source, rs in candidates.items()
                         for r in rs if r.time is None and r.status is not None})
        rows.append([name, str(len(workloads)), f"{len(whole)}/{len(candidates)}",
                     label_of(best) if best else "-",
                     _x(_speedup(whole[best])) if best else "-",
                     _x(_speedup(whole[best], baseline=True)) if best else "-",
                     notes.mark("failed: " + ", ".join(failed)) if failed
                     else "" if candidates else notes.mark(_reference_alone(by_source.get(REFERENCE, [])))])
    print_table(console, f"best solution per Definition on {device} ({timed_by(results)}; --verbose: each solution)",
                ["Definition", "workloads", "passed", "best", "× ref", "× base", "note"], rows,
                left=("best", "note"), notes=notes)


def _why(result: BenchmarkResult, width: int = 160) -> str:
    """A failed result's reason, for a note under a table: the last line of its error (the exception
    a build or a call raised), cut to ``width``; empty where it carries none (a wrong output)."""
    lines = [line.strip() for line in (result.compile_error or result.error or "").splitlines() if line.strip()]
    if not lines:
        return ""
    reason = lines[-1]
    return f" ({reason[:width - 1]}…)" if len(reason) > width else f" ({reason})"


def _reference_alone(reference: list[BenchmarkResult]) -> str:
    """Why a Definition's row has no candidate: only its reference ran (no baseline fits it and no
    Solution was given), and how the reference fared."""
    passed = sum(r.time is not None for r in reference)
    return (f"no solution: only the reference ran ({passed}/{len(reference)} passed); no fi-profile baseline "
            "computes this Definition, and no Solution of it was given")


def print_results(console: Console, results: list[BenchmarkResult], definitions: Mapping[str, Definition] = {},
                  workload_axes: Mapping[str, Mapping[str, int]] = {}) -> None:
    """One table per Definition: each solution's passed workloads, median time, speedups and, where
    the family counts its FLOPs (``definitions`` and the workloads' var axes by uuid given), the
    achieved TFLOP/s and its share of the card's dense peak for the operands' precision."""
    device = results[0].device.name if results else "?"
    for name, by_source in _by_definition(results).items():
        # on a GPU, where the family counts the Definition's FLOPs (a CPU's rate says little)
        rates = {source: _throughput(rs, definitions.get(name), workload_axes) for source, rs in by_source.items()}
        shown = device != "cpu" and any(rate for rate, _ in rates.values())
        rows, notes = [], Notes()
        for source, rs in by_source.items():
            passed = [r for r in rs if r.time is not None]
            failures = sorted({r.status.value for r in rs if r.time is None and r.status is not None})
            unchecked = sorted({n for r in rs if r.check is not None for n in r.check.unchecked})
            if unchecked:
                failures.append(f"computes no {', '.join(unchecked)}")
            median = _median_ms(rs)
            rows.append([
                label_of(source),
                f"{len(passed)}/{len(rs)}",
                f"{median:.4f}" if median is not None else "-",
                *(rates[source] if shown else ()),
                _x(_speedup(rs)) if passed and source != REFERENCE else "",
                _x(_speedup(rs, baseline=True)) if any(r.baseline_speedup for r in passed) else "",
                notes.mark(", ".join(failures)) if failures else "",
            ])
        print_table(console, f"{name} on {device}, {timed_by([r for rs in by_source.values() for r in rs])}",
                    ["solution", "passed", "median ms", *(("TFLOP/s", "% peak") if shown else ()), "× ref", "× base",
                     "failures"], rows, left=("failures",), notes=notes)


def print_projection(console: Console, rows: list[KernelProjection], model: str, timed: str = "") -> None:
    """The model-level projection: each kernel's calls x its baseline's and best solution's times;
    ``timed``: how those times were taken (:func:`timed_by`)."""
    notes, cells = Notes(), []
    for row in rows:
        cells.append([
            row.kernel,
            str(row.count),
            label_of(row.baseline) if row.baseline else f"none {notes.mark(row.missing)}" if row.missing else "-",
            f"{row.count * row.baseline_ms:.3f}" if row.baseline_ms is not None else "-",
            label_of(row.best) if row.best else "-",
            f"{row.count * row.best_ms:.3f}" if row.best_ms is not None else "-",
            f"{row.saved_ms:.3f}",
        ])
    print_table(console, f"{model}: kernel time per the captured calls (ms{', ' + timed if timed else ''})",
                ["kernel", "calls", "baseline", "base ms", "best", "best ms", "saved"], cells,
                left=("baseline", "best"), notes=notes)
    compared = [r for r in rows if r.baseline_ms is not None]
    base_total = sum(r.count * r.baseline_ms for r in compared)
    saved = sum(r.saved_ms for r in rows)
    console.print(
        f"model kernel time: baseline {base_total:.3f} ms, best {base_total - saved:.3f} ms, "
        f"saved {saved:.3f} ms ({100 * saved / base_total if base_total else 0:.1f}%)"
        + (f", over {len(compared)} of {len(rows)} kernels (the others have no baseline)" if len(compared) < len(rows) else ""),
        markup=False, highlight=False, soft_wrap=True,
    )


#: a Definition's share of the measured time from which its projection must match the measurement,
#: how closely, and how closely the total must (issue 22's targets)
MATTERS, ROW_TOLERANCE, TOTAL_TOLERANCE = 0.02, 0.10, 0.05
#: how much lower the engine's SM clock must be than the replay's for a note to name it
CLOCK_GAP = 0.05


def bias_routed_dummy(record: KernelCallingRecord, definitions: Mapping[str, Definition]) -> frozenset[str]:
    """The MoE Definitions routed through a bias in a capture that ran dummy weights: a correction
    bias among their inputs (DeepSeek's), or a router GEMM with a bias in the record, one that maps
    the MoE's hidden size to its experts (gpt-oss's ``gemm_bias_*_n{experts}_k{hidden}``). There the
    bias alone picks the experts, the same for every token: activations scaled by norm weights within
    ±1e-3, times router weights within ±1e-3, score about √hidden · 1e-6, against a bias up to 1e-3.
    None where the capture zeroed the model's biases (``run.dummy_biases_zeroed``)."""
    if record.run is None or not (record.run.weights or "").startswith("dummy") or record.run.dummy_biases_zeroed:
        return frozenset()
    recorded = {kernel.id for kernel in record.kernels}
    routers = {(_const(d, "N"), _const(d, "K")) for name, d in definitions.items()
               if name in recorded and d.op_type == "gemm" and "bias" in d.inputs}
    return frozenset(name for name, d in definitions.items() if "routing_logits" in d.inputs and (
        "routing_bias" in d.inputs or (_const(d, "num_experts"), _const(d, "hidden_size")) in routers))


def _const(definition: Definition, axis: str) -> Optional[int]:
    found = definition.axes.get(axis)
    return getattr(found, "value", None) if found is not None else None


def print_measured(console: Console, rows: list[MeasuredRow], total_ms: float, device: str,
                   timers: frozenset[str] = frozenset(), bias_routed_dummy: frozenset[str] = frozenset()) -> None:
    """The engine-baseline projection beside the engine's kernel time measured in the capture;
    ``timers``: how the replayed times were taken (the results' ``timing.method``);
    ``bias_routed_dummy``: MoE Definitions routed through a correction bias in a capture with dummy
    weights, whose routing the replay's random logits do not reproduce."""
    what = "kernel time" if device == "cuda" else "operator time (CPU)"
    how = f"; replay timed by {', '.join(sorted(timers))}" if timers else ""
    clocks = any(r.engine_mhz is not None or r.replay_mhz is not None for r in rows)
    headers = ["kernel", "calls", "measured", "projected", "ratio", "engine's kernel", "best saves"]
    if clocks:
        headers[5:5] = ["SM MHz eng/replay", "at eng. MHz"]
    off, cells, notes = [], [], Notes()
    for row in rows:
        ratio = row.ratio
        flag = ""
        if ratio is not None and row.measured_ms >= MATTERS * total_ms and abs(ratio - 1) > ROW_TOLERANCE:
            flag = " !"
            off.append(row)
        engine = row.engine if len(row.engine) <= 24 else notes.mark(row.engine)
        line = [" + ".join(row.kernels), str(row.calls), f"{row.measured_ms:.3f}",
                f"{row.projected_ms:.3f}" if row.projected_ms is not None else "-",
                f"{ratio:.2f}{flag}" if ratio is not None else "-", engine, f"{row.saved_ms:.3f}"]
        if clocks:
            line[5:5] = [f"{_mhz(row.engine_mhz)}/{_mhz(row.replay_mhz)}", _x(row.ratio_at_engine_clock)]
        cells.append(line)
    print_table(console, f"projection against the engine's measured {what} (ms, over the captured steps{how}; "
                "ratio: projected / measured"
                + ("; at eng. MHz: the ratio with the replayed times scaled to the engine's SM clock" if clocks else "")
                + ")", headers, cells, left=("engine's kernel",), notes=notes)
    compared = [r for r in rows if r.projected_ms is not None]
    measured = sum(r.measured_ms for r in compared)
    projected = sum(r.projected_ms for r in compared)  # type: ignore[misc]
    attributed = sum(r.measured_ms for r in rows)
    line = (f"engine {what}: {total_ms:.3f} ms measured, {attributed:.3f} ms of it attributed to these Definitions; "
            f"projected with the engine's kernels: {projected:.3f} ms where the measurement is {measured:.3f} ms")
    if measured > 0:
        ratio = projected / measured
        line += f" (× {ratio:.2f}{', outside ±5%' if abs(ratio - 1) > TOTAL_TOLERANCE else ''})"
        scaled = [r for r in compared if r.at_engine_clock_ms is not None]
        if scaled:
            line += (f"; × {sum(_at_engine_clock(r) for r in compared) / measured:.2f} with the replayed times scaled to "
                     "the engine's SM clock "
                     + (f"where both clocks are known ({len(scaled)} of {len(compared)} rows)" if len(scaled) < len(compared)
                        else "(as a kernel bound by its clock: the most the clocks explain)"))
    if len(compared) < len(rows):
        line += f"; {len(rows) - len(compared)} row(s) have no replay of the engine's kernel"
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    if off:
        console.print(f"! projected outside ±{100 * ROW_TOLERANCE:.0f}% of the measurement for a kernel with "
                      f"≥{100 * MATTERS:.0f}% of the time: the replay times one call at a time, the L2 flushed before "
                      "it, and the workloads kept stand for all the calls; the engine's kernels ran in a stream, "
                      "between others, at the clock its load left the GPU (compute-bound kernels slow down through "
                      "a long step: BENCHMARKS.md)", markup=False, highlight=False, soft_wrap=True)
        slower = [r for r in off if r.engine_mhz and r.replay_mhz and r.engine_mhz < (1 - CLOCK_GAP) * r.replay_mhz]
        if slower:
            console.print("! of those, the engine ran at a lower SM clock than the replay timed at (measured, NVML): "
                          + "; ".join(f"{' + '.join(r.kernels)} {r.engine_mhz:,.0f} against {r.replay_mhz:,.0f} MHz "
                                      f"(× {_x(r.ratio_at_engine_clock)} at the engine's clock)"
                                      for r in slower)
                          + ": a compute-bound kernel takes longer in proportion", markup=False, highlight=False,
                          soft_wrap=True)
        collapsed = [r for r in off if set(r.kernels) & bias_routed_dummy]
        if collapsed:
            console.print("! " + "; ".join(" + ".join(r.kernels) for r in collapsed) + ": the capture ran dummy "
                          "weights (every parameter within ±1e-3), so the router's scores hardly differ between "
                          "tokens and its bias (a correction bias, or the router GEMM's) sends every token to the "
                          "same experts, while the replay's "
                          "random routing logits spread them over the experts as a trained model's do: the engine "
                          "read fewer experts' weights per step (measured: BENCHMARKS.md, SGLang's FP8 latent cache "
                          "section)", markup=False, highlight=False, soft_wrap=True)
    if device == "cuda" and any("events" in t or t == "cuda_graph" for t in timers):
        console.print("note: CUDA events time a kernel of a few µs at 2-2.5× the duration the engine's accounting "
                      "measures for it (benchmarks/l2_state.py); the kernels timer (the default) times the replay as "
                      "the accounting does", markup=False, highlight=False, soft_wrap=True)


def _at_engine_clock(row: MeasuredRow) -> float:
    """The row's projection at the engine's clock, or as replayed where a clock is unknown."""
    scaled = row.at_engine_clock_ms
    return scaled if scaled is not None else row.projected_ms  # type: ignore[return-value]


def _mhz(value: Optional[float]) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def print_breakdown(console: Console, document: dict) -> None:
    """Where the replay's time went (``time_breakdown.json``)."""
    rows = [[phase, f"{seconds:.1f}"] for phase, seconds in document["phases_s"].items()]
    rows.append(["worker start, transfers", f"{document['worker_start_and_transfer_s']:.1f}"])
    print_table(console, f"Where the time went: {document['pairs']} pairs in {document['wall_s']:.1f} s "
                f"({document['pairs_per_minute']} pairs/min) on {', '.join(document['devices'])}",
                ["phase", "s (summed over pairs)"], rows)
    stopping = document.get("stopping") or {}
    spread = stopping.get("median_rel_error")
    if stopping.get("pairs_stopped_by"):
        console.print("timed loops stopped by " + ", ".join(f"{why} {n}" for why, n in stopping["pairs_stopped_by"].items())
                      + (f"; the medians' relative standard error {100 * spread['median']:.2f}% (median), "
                         f"{100 * spread['p90']:.2f}% (p90), {100 * spread['max']:.2f}% (max)" if spread else ""),
                      markup=False, highlight=False, soft_wrap=True)
    prewarmed = document.get("prewarmed") or {}
    if prewarmed.get("tasks"):
        failed = prewarmed.get("failed") or {}
        said = ", ".join(f"{n} {status}" for status, n in sorted(failed.items()))
        console.print(f"built up front, in parallel: {prewarmed['tasks']} (Definition, solution) warm-ups"
                      + (f", not all warm ({said}): their pairs built them again" if failed else "")
                      + (f"; {prewarmed['cancelled']} of no more use once the pairs were done, stopped"
                         if prewarmed.get("cancelled") else ""))
    by_solution = document.get("by_solution") or {}
    if by_solution:
        console.print("by solution: " + ", ".join(f"{label} {v['s']:.1f} s ({v['pairs']} pairs)"
                                                  for label, v in by_solution.items()))
