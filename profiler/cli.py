"""The ``fi-profile`` command line."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, NoReturn, Optional

import click
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from fi_profile.catalog import shipped_definitions

if TYPE_CHECKING:
    from fi_profile.capture.engine_run import Engine
    from fi_profile.capture.options import CaptureOptions
    from fi_profile.schema.run_info import RunInfo


class CaptureByDefault(TyperGroup):
    """``fi-profile --model M --framework F ...`` is ``fi-profile capture --model M ...``: options
    before any command are the capture's, so a command after them is an extra argument (an error),
    never a command that silently drops them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in self.get_help_option_names(ctx):
            args = ["capture", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=CaptureByDefault,
    name="fi-profile",
    help="Profile the kernels an LLM engine calls; benchmark candidate kernels on those workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


class Framework(str, Enum):
    vllm = "vllm"
    sglang = "sglang"


#: the default scenario: serving-like (prompts over a wide range, outputs long enough for decode to dominate)
DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN = "128:2048", "32:256"


class LoadFormat(str, Enum):
    auto = "auto"
    dummy = "dummy"


@app.command()
def capture(
    model: Annotated[
        Optional[str],
        typer.Option(help="Hugging Face id or local folder; shipped configs: meta-llama/Llama-3.1-8B, fi-profile/tiny-llama."),
    ] = None,
    framework: Annotated[Framework, typer.Option(help="Engine to run.")] = Framework.vllm,
    out_dir: Annotated[Path, typer.Option("--out", help="Output folder (flashinfer-trace layout).")] = Path("fi-profile-out"),
    num_prompts: Annotated[int, typer.Option(min=1, help="Requests (default: a serving-like batch).")] = 64,
    input_len: Annotated[
        Optional[str], typer.Option(help="Prompt tokens per request: N, or MIN:MAX (each request's drawn, seeded). "
                                    "Default 128:2048 (1024 with --range-ratio, as vLLM's serving benchmark).")
    ] = None,
    output_len: Annotated[
        Optional[str], typer.Option(help="New tokens per request: N, or MIN:MAX. Default 32:256, long enough for "
                                    "decode to dominate (128 with --range-ratio).")
    ] = None,
    range_ratio: Annotated[
        float,
        typer.Option(help="As vLLM's serving benchmark: lengths drawn from [N(1-r), N(1+r)] for a single N."),
    ] = 0.0,
    batch_size: Annotated[int, typer.Option(min=1, help="Most requests the engine runs at once.")] = 256,
    tp: Annotated[int, typer.Option(min=1, help="Tensor-parallel size.")] = 1,
    dtype: Annotated[str, typer.Option()] = "bfloat16",
    load_format: Annotated[LoadFormat, typer.Option(help="dummy: random weights, no download.")] = LoadFormat.dummy,
    seed: Annotated[int, typer.Option()] = 0,
    max_workloads: Annotated[
        int, typer.Option(min=1, help="Workloads kept per Definition: the most frequent half, the rest spread over the "
                          "axis values (replay's --max-workloads chooses the same way).")
    ] = 32,
    eager: Annotated[
        bool,
        typer.Option(
            "--eager/--no-eager",
            help="Default: the engine's own default, recorded exactly (vLLM: torch.compile and CUDA graphs; "
            "SGLang: CUDA graphs). --eager: no graphs, no torch.compile.",
        ),
    ] = False,
    temperature: Annotated[float, typer.Option(min=0.0, help="0: greedy (the sampler's argmax).")] = 0.0,
    top_k: Annotated[int, typer.Option(min=0, help="0: off.")] = 0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    single_process: Annotated[bool, typer.Option("--single-process", help="Engine core in this process.")] = False,
    attention_backend: Annotated[
        Optional[str], typer.Option(help="vLLM attention backend, e.g. TRITON_ATTN, FLASHINFER.")
    ] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(min=0.05, max=1.0)] = None,
    count_only: Annotated[bool, typer.Option("--count-only", help="Calls per Definition only, no workloads (cheapest).")] = False,
    engine_arg: Annotated[
        Optional[list[str]],
        typer.Option(
            "--engine-arg",
            help="KEY=VALUE passed to the engine's constructor by name (vllm.LLM, sglang.Engine); VALUE as JSON "
            "where it parses (true, 0.5, {...}), else a string. Repeatable.",
        ),
    ] = None,
    kernel_accounting: Annotated[
        bool,
        typer.Option("--kernel-accounting/--no-kernel-accounting",
                     help="Measure the engine's own kernels (torch.profiler) and attribute them to Definitions "
                          "(run.engine_kernels)."),
    ] = True,
    min_attributed: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="On a GPU: the attributed share of the engine's kernel time below "
                                                   "which the record is incomplete.")
    ] = 0.95,
    save_every: Annotated[
        float, typer.Option(min=0.0, help="Seconds between saves of each engine process's part (kept if the engine dies).")
    ] = 10.0,
    accept_hook_errors: Annotated[
        bool,
        typer.Option(
            "--accept-hook-errors",
            help="Exit 0 even when hooks failed or layers were not covered (the record still says what it misses).",
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the engine's own output here instead of DIR/engine.log.")
    ] = False,
) -> None:
    """Run MODEL in a real engine and record every kernel-level call it makes (also: fi-profile --model M ...)."""
    if model is None:
        err.print("--model is required (try --model fi-profile/tiny-llama on CPU)")
        raise typer.Exit(code=2)
    from fi_profile.capture.engine_run import Scenario, model_problem, parse_engine_args
    from fi_profile.capture.lengths import Length
    from fi_profile.capture.options import CaptureOptions, EngineOptions, engine_runner

    input_len = input_len or ("1024" if range_ratio else DEFAULT_INPUT_LEN)
    output_len = output_len or ("128" if range_ratio else DEFAULT_OUTPUT_LEN)
    try:
        lengths = (Length.parse(input_len, "--input-len", range_ratio), Length.parse(output_len, "--output-len", range_ratio))
    except ValueError as exc:
        _usage_error(str(exc))
    problem = model_problem(model)
    if problem is not None:
        err.print(problem, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=2)
    runner = engine_runner(framework.value)
    try:
        engine_args = parse_engine_args(engine_arg or [], runner.OWN_ARGUMENTS)
    except ValueError as exc:
        _usage_error(str(exc))
    options = CaptureOptions(
        model=model,
        out_dir=out_dir,
        scenario=Scenario.of_lengths(*lengths, num_prompts=num_prompts, batch_size=batch_size, seed=seed,
                                     temperature=temperature, top_k=top_k, top_p=top_p),
        engine=EngineOptions(load_format=load_format.value, dtype=dtype, tp=tp, eager=eager, single_process=single_process,
                             attention_backend=attention_backend, gpu_memory_utilization=gpu_memory_utilization,
                             engine_args=engine_args),
        max_workloads=max_workloads,
        count_only=count_only,
        autosave_s=save_every,
        kernel_accounting=kernel_accounting,
        min_attributed=min_attributed,
    )
    run = _run_capture(runner.ENGINE, options, framework, verbose)
    _exit_for(run, accept_hook_errors)


def _usage_error(message: str) -> NoReturn:
    err.print(message, markup=False, highlight=False)
    raise typer.Exit(code=2) from None


def _run_capture(engine: Callable[..., Engine], options: CaptureOptions, framework: Framework, verbose: bool) -> RunInfo:
    """The capture, with the engine's output in ``DIR/engine.log`` (or here, ``verbose``) under a
    progress line; its summary printed. An engine that could not start or died mid-run exits 1,
    saying why (and what its processes saved)."""
    from fi_profile.capture.engine_failure import known_cause, said_of, with_root_cause
    from fi_profile.capture.engine_output import ENGINE_LOG, ProgressLine, engine_output_to
    from fi_profile.capture.engine_run import EngineFailed, clear_output, run_capture
    from fi_profile.capture.interruption import Interrupted, signals_interrupt
    from fi_profile.capture.report import print_summary

    out_dir = options.out_dir
    log = None if verbose else out_dir / ENGINE_LOG
    out_dir.mkdir(parents=True, exist_ok=True)
    clear_output(out_dir)
    failed: Optional[EngineFailed] = None
    crash: Optional[BaseException] = None
    stopped: Optional[Interrupted] = None
    with engine_output_to(log) as terminal, signals_interrupt(out_dir, lambda text: terminal.print(
            f"\n{text}", markup=False, highlight=False, soft_wrap=True)):
        with ProgressLine(terminal, out_dir, f"{options.model} on {framework.value}", log) if not verbose else _nothing():
            try:
                summary, _, run = run_capture(engine, options)
            except EngineFailed as exc:
                failed = exc
            except Interrupted as exc:
                stopped = exc
            except Exception as exc:  # noqa: BLE001 - the engine could not start or run: said in one line
                crash = exc
    if stopped is not None:
        if stopped.summary is not None:
            print_summary(out, stopped.summary, out_dir)
            err.print(f"[red]{stopped.summary.record.run.incomplete}[/red]", highlight=False)
        else:
            err.print(f"[red]interrupted by {stopped.name} before any part was saved: no record[/red]", highlight=False)
        if stopped.unanswered is not None:  # the engine's client may wait on, or abort at, its channel at exit
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(stopped.exit_code)
        raise typer.Exit(code=stopped.exit_code) from None
    if crash is not None:
        where = f"; the engine's output is in {log}" if log else ""
        cause = known_cause(log, str(crash))
        if cause is not None:  # a host the engine cannot run this model on: that, in one line
            err.print(f"[red]cannot run {options.model} here: {cause}{where}[/red]", highlight=False, soft_wrap=True)
            raise typer.Exit(code=1) from None
        said = with_root_cause(said_of(crash), log)
        err.print(f"[red]the engine failed: {said}{where}[/red]", highlight=False)
        _print_log_tail(log)
        raise typer.Exit(code=1) from None
    if failed is not None:
        if failed.summary is not None:
            print_summary(out, failed.summary, out_dir)
        err.print(
            f"[red]{failed.run.incomplete}[/red]"
            if failed.summary
            else f"[red]engine failed before any part was saved: {failed}[/red]"
        )
        if log:
            err.print(f"the engine's output is in {log}")
            _print_log_tail(log)
        raise typer.Exit(code=1) from None
    assert summary is not None
    print_summary(out, summary, out_dir)
    return run


def _exit_for(run: RunInfo, accept_hook_errors: bool) -> None:
    """The exit policy: 0 when the record is complete; 1 when it is not (``run.incomplete`` says
    how), unless ``--accept-hook-errors``; the record says it either way."""
    if not run.incomplete:
        return
    if accept_hook_errors:
        err.print("[yellow]the record is incomplete (run.incomplete says how); accepted with --accept-hook-errors[/yellow]")
    else:
        err.print(f"[red]the record is incomplete: {run.incomplete}[/red]", highlight=False)
        err.print("record.json says so (run.incomplete); pass --accept-hook-errors to exit 0 all the same")
        raise typer.Exit(code=1) from None


def _print_log_tail(log: Optional[Path], lines: int = 15) -> None:
    """The end of the engine's log, where its own account of a failure is."""
    if log is None or not log.is_file():
        return
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-lines:]
    if tail:
        err.print(f"last {len(tail)} lines of {log}:", highlight=False)
        for line in tail:
            err.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _nothing():
    yield


def _names(values: Optional[list[str]]) -> Optional[list[str]]:
    """A list option given as repeated flags, comma-separated, or both: ``--x a,b --x c``."""
    if values is None:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


@app.command()
def recover(
    out_dir: Annotated[Path, typer.Argument(help="The folder of a capture that was stopped before it wrote its record.")],
) -> None:
    """Build the record, Definitions and workloads of a capture killed before it ended (SIGKILL, an
    OOM kill, a lost node) from the parts its engine processes saved every --save-every seconds.
    The record says it is incomplete and why; exits 1 when there is nothing to recover."""
    from fi_profile.capture.recovery import NothingToRecover
    from fi_profile.capture.recovery import recover as recovered
    from fi_profile.capture.report import print_summary

    try:
        summary = recovered(out_dir)
    except NothingToRecover as exc:
        err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    print_summary(out, summary, out_dir)
    assert summary.record.run is not None
    err.print(f"[yellow]recovered, incomplete: {summary.record.run.incomplete}[/yellow]", highlight=False)


@app.command()
def validate(
    paths: Annotated[
        Optional[list[Path]],
        typer.Argument(help="Files or folders (JSON / JSONL), any kind. Default: the shipped definitions."),
    ] = None,
) -> None:
    """Check definitions, workloads, solutions, records, results and agent traces.

    Prints ``file: field.path: message`` for each problem and exits 1 if any is an error.
    """
    from fi_profile.catalog import shipped_definitions_dir
    from fi_profile.validate import validate_paths

    report = validate_paths(paths or [shipped_definitions_dir()])
    for problem in report.problems:
        err.print(str(problem), markup=False, highlight=False, soft_wrap=True)
    table = Table(title="Validated documents")
    table.add_column("kind")
    table.add_column("count", justify="right")
    for kind, count in sorted(report.counts().items(), key=lambda kv: kv[0].value):
        table.add_row(kind.value, str(count))
    out.print(table)
    n_errors, n_warnings = len(report.errors), len(report.problems) - len(report.errors)
    out.print(f"{n_errors} error(s), {n_warnings} warning(s)")
    if n_errors:
        raise typer.Exit(code=1) from None


@app.command()
def definitions(
    op_type: Annotated[Optional[str], typer.Option("--op-type", help="Only this op type.")] = None,
) -> None:
    """List the shipped kernel Definitions."""
    shipped = [d for d in shipped_definitions().values() if op_type in (None, d.op_type)]
    if not shipped:
        known = sorted({d.op_type for d in shipped_definitions().values()})
        err.print(f"no shipped definition has op type {op_type!r}; op types: {', '.join(known)}")
        raise typer.Exit(code=1) from None
    table = Table(title=f"{len(shipped)} shipped definitions")
    for column in ("op type", "name", "const axes", "var axes", "inputs → outputs"):
        table.add_column(column, no_wrap=column == "name")  # a name is looked up whole
    for d in sorted(shipped, key=lambda d: (d.op_type, d.name)):
        table.add_row(
            d.op_type,
            d.name,
            " ".join(f"{k}={v}" for k, v in d.const_axes.items()),
            " ".join(d.var_axes),
            f"{', '.join(d.inputs)} → {', '.join(d.outputs)}",
        )
    out.print(table)


@app.command()
def replay(
    dataset_dir: Annotated[Path, typer.Argument(help="A capture output or a flashinfer-trace dataset folder.")],
    solutions: Annotated[
        list[str],
        typer.Option(
            "--solutions",
            help="Solution JSON files or folders; 'baselines' adds the shipped ones. Repeat the flag or separate with commas.",
        ),
    ] = ("baselines",),
    results_dir: Annotated[Path, typer.Option("--out", help="Folder for results.jsonl.")] = Path("fi-profile-results"),
    definition_names: Annotated[
        Optional[list[str]],
        typer.Option("--definitions", help="Only these Definitions (repeat the flag or separate with commas)."),
    ] = None,
    device: Annotated[Optional[str], typer.Option(help="cuda:N, or cpu (wall-clock timing): one device.")] = None,
    devices: Annotated[
        Optional[list[str]],
        typer.Option(help="One worker per device, pairs spread over them (cuda:0,cuda:1,...). Default: every "
                     "visible GPU, else cpu."),
    ] = None,
    ray: Annotated[
        Optional[str],
        typer.Option(help="Replay on a Ray cluster: its address (ray://host:10001, auto), or 'local' to start one "
                     "here; each workload (its reference and solutions) a Ray task with one GPU (one CPU "
                     "where the cluster has none)."),
    ] = None,
    baseline: Annotated[
        str, typer.Option(help="Solution (name or label, e.g. torch) that 'x baseline' and the projection compare "
                          "with; 'engine': per Definition, the kernel the captured engine ran (where the replay has it).")
    ] = "engine",
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds per (workload, solution), build included.")] = 120.0,
    max_workloads: Annotated[
        Optional[int], typer.Option(min=1, help="At most this many workloads per Definition, chosen as a capture "
                                    "keeps them: the most frequent half, the rest spread over the axis values.")
    ] = None,
    min_time: Annotated[float, typer.Option(min=0.0, help="At least these seconds of timed calls per pair.")] = 0.0,
    max_time: Annotated[float, typer.Option(min=0.0, help="At most these seconds of timed calls per pair (after "
                                            "10 calls).")] = 0.1,
    precision: Annotated[float, typer.Option(min=0.0, help="Stop timing a pair once its median's estimated "
                                             "relative standard error is below this.")] = 0.01,
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph", help="Time CUDA-graph replays of each call (labelled).")] = False,
    timer: Annotated[
        str, typer.Option(help="'kernels': the durations of the call's own kernels (CUPTI, through torch.profiler), "
                          "as the capture's engine kernel accounting measures the engine's (a call CUPTI links no "
                          "kernel to is timed by events, and its result says so); 'events': CUDA events around "
                          "each call (its device time, gaps between its kernels included). CPU: wall clock.")
    ] = "kernels",
    warm_inputs: Annotated[
        bool, typer.Option("--warm-inputs/--cold-inputs", help="After the L2 flush before each call, read the "
                           "call's per-step inputs (activations, not weights or the KV cache) back into the L2, as "
                           "the engine's previous kernel leaves them.")
    ] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Skip pairs already in results.jsonl.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="A table per Definition (each solution's median, "
                                          "speedups, failures), not only the best solution of each.")] = False,
    prewarm: Annotated[
        Optional[bool],
        typer.Option("--prewarm/--no-prewarm", help="Build what the pairs compile (FlashInfer JIT, Triton, "
                     "torch.compile) up front in parallel worker processes. Default: on GPUs."),
    ] = None,
) -> None:
    """Benchmark candidate solutions against the references on the dataset's workloads."""
    solutions, definition_names = _names(solutions) or [], _names(definition_names)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from fi_profile.capture.interruption import Interrupted, signals_interrupt
    from fi_profile.replay.breakdown import FILE as BREAKDOWN_FILE
    from fi_profile.replay.dataset import DatasetError, load_dataset, load_solutions
    from fi_profile.replay.report import print_breakdown, print_results
    from fi_profile.replay.runner import ReplayOptions, read_results, without_pairs
    from fi_profile.replay.runner import replay as run_replay
    from fi_profile.replay.timing import TIMERS

    with_baselines = "baselines" in solutions
    try:
        dataset = load_dataset(dataset_dir, definition_names)
        given = load_solutions([Path(p) for p in solutions if p != "baselines"], dataset.definitions)
    except DatasetError as exc:
        err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    unknown = sorted({s.definition for s in given} - set(dataset.definitions))
    if unknown:
        err.print(f"{dataset_dir}: solutions name Definitions it does not have: {', '.join(unknown)}")
        raise typer.Exit(code=1) from None
    captured_workloads = dataset.workloads  # the projection weighs every one of them
    if max_workloads is not None:
        from fi_profile.workload_choice import choose_workloads

        dataset.workloads = {name: choose_workloads(ws, max_workloads, lambda w: w.count or 0, lambda w: w.axes)
                             for name, ws in dataset.workloads.items()}
    try:
        if timer not in TIMERS:
            raise ValueError(f"--timer {timer}: expected one of {', '.join(TIMERS)}")
        chosen = replay_devices(device, _names(devices))
        if ray is not None:
            if device is not None or devices:
                raise ValueError("--ray with --device/--devices: Ray places each pair on a GPU of the cluster")
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise ValueError("--ray: Ray is not installed here (pip install 'fi-profile[ray]')")
    except ValueError as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(code=2) from None
    options = ReplayOptions(device=chosen[0], devices=chosen, ray=ray, timeout_s=timeout, min_time_s=min_time,
                            max_time_s=max_time, precision=precision,
                            cuda_graph=cuda_graph, timer=timer, warm_inputs=warm_inputs, baseline=baseline,
                            resume=resume, prewarm=prewarm)
    # at the 80 columns of a log the counts, rate and ETA stay whole: a shorter bar, and the pair's
    # name (what is being replayed now) cut to what is left
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=max(8, min(40, err.width - 72))),
               MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    described = max(16, min(60, err.width - 56))
    with Progress(*columns, console=err) as bar:
        task = bar.add_task("replay", total=None, rate="")
        began = time.monotonic()
        per_device: dict[str, Any] = {}  # device -> its own line: pairs done there and its rate

        def advanced(advance: int, what: str, device: Optional[str] = None) -> None:
            done = bar.tasks[0].completed + advance
            per_minute = done / max(time.monotonic() - began, 1e-9) * 60
            what = f"all: {what}"
            bar.update(task, advance=advance, rate=f"{per_minute:.0f} pairs/min",
                       description=what if len(what) <= described else what[: described - 1] + "…")
            if device is None:  # a resumed pair, already in results.jsonl
                return
            if device not in per_device:
                per_device[device] = bar.add_task(device, total=None, rate="")
            line = per_device[device]
            there = bar.tasks[line].completed + advance
            bar.update(line, advance=advance, rate=f"{there / max(time.monotonic() - began, 1e-9) * 60:.0f} pairs/min")

        stopped: Optional[Interrupted] = None
        resume_with = f"fi-profile replay {dataset_dir} --out {results_dir} --resume (with the same options)"
        with signals_interrupt(results_dir, lambda text: err.print(text, markup=False, highlight=False),
                               kept=f"the results so far are in {results_dir / 'results.jsonl'}: {resume_with}"):
            try:
                results = run_replay(dataset, given, with_baselines, results_dir, options, progress=advanced,
                                     plan=lambda total: bar.update(task, total=total))
            except Interrupted as exc:  # what finished is on disk: reported below, as a whole replay's
                stopped = exc
                results = read_results(results_dir / "results.jsonl")
    if verbose:
        print_results(out, results, dataset.definitions,
                      {w.uuid: w.axes for workloads in dataset.workloads.values() for w in workloads})
    projection, against = _print_outcome(results, dataset, captured_workloads, baseline)
    for name, why in without_pairs(dataset, results).items():
        out.print(f"not replayed: {name} ({why})", markup=False, highlight=False)
    if not results and stopped is None:
        err.print(f"nothing was replayed of {len(dataset.definitions)} Definition(s) in {dataset_dir} (why: above)",
                  markup=False, highlight=False)
        raise typer.Exit(code=1)
    if (results_dir / BREAKDOWN_FILE).is_file():
        print_breakdown(out, json.loads((results_dir / BREAKDOWN_FILE).read_text()))
    if results:
        _write_report(results_dir, results, dataset, captured_workloads, projection, against)
    where = f"Ray cluster {ray}" if ray is not None else f"devices {', '.join(chosen)}"
    out.print(f"results: {results_dir / 'results.jsonl'} ({len(results)} results, {where})")
    if stopped is not None:
        err.print(f"stopped by {stopped.name} after {len(results)} results: the tables above are of the workloads "
                  f"whose pairs all finished; the rest: {resume_with}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=stopped.exit_code)


def _print_outcome(results: list, dataset: Any, workloads: dict, baseline: str) -> tuple[list, list]:
    """The best solution per Definition and, for a capture, the projection onto the model and the
    projection with the engine's kernels beside its measured kernel time; returns those two
    projections (for the report)."""
    from fi_profile.replay.engine_kernel import ENGINE
    from fi_profile.replay.projection import against_measurement, project
    from fi_profile.replay.report import bias_routed_dummy, print_best, print_measured, print_projection, timed_by

    print_best(out, results)
    projection, against = [], []
    if dataset.record is not None:
        projection = project(dataset.record, results, workloads, baseline, dataset.definitions)
        print_projection(out, projection, dataset.record.model, timed_by(results))
        measured = dataset.record.run.engine_kernels if dataset.record.run is not None else None
        if measured is not None:  # the projection as the engine ran its kernels, beside what they took
            engine = project(dataset.record, results, workloads, ENGINE, dataset.definitions)
            against = against_measurement(engine, measured)
            timers = frozenset(r.timing.method for r in results if r.timing is not None and r.source != "reference")
            print_measured(out, against, measured.total_ms, measured.device, timers,
                           bias_routed_dummy(dataset.record, dataset.definitions))
    return projection, against


def _write_report(results_dir: Path, results: list, dataset: Any, workloads: dict, projection: list,
                  against: list) -> None:
    from fi_profile.replay.html_report import available, write_report

    why = available()
    if why is not None:
        out.print(f"no report.html: {why}", markup=False, highlight=False)
        return
    path = write_report(results_dir, results, dataset.definitions, workloads, dataset.record, projection, against)
    out.print(f"report: {path}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def report(
    results_dir: Annotated[Path, typer.Argument(help="A replay's results folder (results.jsonl).")],
    dataset_dir: Annotated[Path, typer.Argument(help="The capture output or dataset it replayed.")],
    baseline: Annotated[str, typer.Option(help="As replay's --baseline.")] = "engine",
) -> None:
    """Print a replay's tables again (best solutions, the projection) from its results, and write
    RESULTS/report.html (one self-contained page: plots of the replay and the capture)."""
    from fi_profile.replay.dataset import DatasetError, load_dataset
    from fi_profile.replay.runner import read_results

    results = read_results(results_dir / "results.jsonl")
    if not results:
        err.print(f"{results_dir / 'results.jsonl'}: no results to report", markup=False, highlight=False)
        raise typer.Exit(code=1)
    try:
        dataset = load_dataset(dataset_dir)
    except DatasetError as exc:
        err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    projection, against = _print_outcome(results, dataset, dataset.workloads, baseline)
    _write_report(results_dir, results, dataset, dataset.workloads, projection, against)


def replay_devices(device: Optional[str], devices: Optional[list[str]]) -> list[str]:
    """The replay's devices: ``--device`` alone, else ``--devices``, else every visible GPU (or the CPU)."""
    import torch

    if device is not None and devices:
        raise ValueError("--device and --devices together: give one")
    chosen = [device] if device is not None else devices or (
        [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"])
    for name in chosen:
        kind, _, index = name.partition(":")
        if kind == "cpu" and not index:
            continue
        if kind != "cuda" or not index.isdigit():
            raise ValueError(f"--devices {name}: expected cuda:N or cpu")
        if int(index) >= torch.cuda.device_count():
            raise ValueError(f"--devices {name}: this machine has {torch.cuda.device_count()} visible GPU(s)")
    gpus = [d for d in chosen if d != "cpu"]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--devices {','.join(chosen)}: a GPU named twice (two workers would time on it at once)")
    return chosen


@app.command()
def inspect(
    traces: Annotated[
        list[Path], typer.Argument(help="Agent traces: typed list, conversation, or request/response log (JSONL).")
    ],
    page: Annotated[Path, typer.Option("--out", help="The HTML page to write.")] = Path("agent-traces.html"),
    results: Annotated[
        Optional[list[Path]], typer.Option("--results", help="Benchmark Results (results.jsonl) of solutions the traces name.")
    ] = None,
) -> None:
    """Write one self-contained HTML page showing agent traces as timelines."""
    from fi_profile.agent_traces.load import TraceError, load_trace
    from fi_profile.agent_traces.page import render_page
    from fi_profile.agent_traces.results import load_results, summarize

    loaded, problems = [], []
    for path in traces:
        try:
            loaded.append(load_trace(path))
        except TraceError as exc:
            problems += exc.problems
    found = []
    for path in results or []:
        rs, bad = load_results(path)
        found += rs
        problems += bad
    if problems:
        for problem in problems:
            err.print(str(problem), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render_page(loaded, summarize(found)), encoding="utf-8")
    entries = sum(len(t.trace.root) for t in loaded)
    out.print(f"{page}: {len(loaded)} trace(s), {entries} entries" + (f", {len(found)} benchmark results" if results else ""))


@app.command("convert-trace")
def convert_trace(
    trace: Annotated[Path, typer.Argument(help="A conversation object or a request/response log (JSONL).")],
    converted: Annotated[Path, typer.Option("--out", help="Where to write the typed list (JSON).")],
) -> None:
    """Convert an agent trace to the seed's typed list of llm_request / tool_call entries."""
    from fi_profile.agent_traces.load import TraceError, load_trace

    try:
        loaded = load_trace(trace)
    except TraceError as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    converted.parent.mkdir(parents=True, exist_ok=True)
    converted.write_text(loaded.trace.model_dump_json(indent=2, exclude_none=True) + "\n", encoding="utf-8")
    out.print(f"{converted}: {len(loaded.trace.root)} entries from a {loaded.form}")


def main() -> None:  # pragma: no cover - console entry
    app()
