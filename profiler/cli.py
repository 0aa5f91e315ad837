"""The ``fi-profile`` command line."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from profiler.catalog import shipped_definitions

app = typer.Typer(
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


class LoadFormat(str, Enum):
    auto = "auto"
    dummy = "dummy"


@app.callback(invoke_without_command=True)
def capture(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option(help="Hugging Face id or local folder; shipped configs: meta-llama/Llama-3.1-8B, fi-profile/tiny-llama.")] = None,
    framework: Annotated[Framework, typer.Option(help="Engine to run.")] = Framework.vllm,
    out_dir: Annotated[Path, typer.Option("--out", help="Output folder (flashinfer-trace layout).")] = Path("fi-profile-out"),
    num_prompts: Annotated[int, typer.Option(min=1)] = 4,
    input_len: Annotated[int, typer.Option(min=1, help="Prompt tokens per request.")] = 32,
    output_len: Annotated[int, typer.Option(min=1, help="New tokens per request.")] = 8,
    batch_size: Annotated[int, typer.Option(min=1, help="Most requests the engine runs at once.")] = 256,
    tp: Annotated[int, typer.Option(min=1, help="Tensor-parallel size.")] = 1,
    dtype: Annotated[str, typer.Option()] = "bfloat16",
    load_format: Annotated[LoadFormat, typer.Option(help="dummy: random weights, no download.")] = LoadFormat.dummy,
    seed: Annotated[int, typer.Option()] = 0,
    max_workloads: Annotated[int, typer.Option(min=1, help="Workloads kept per definition.")] = 32,
    eager: Annotated[bool, typer.Option("--eager/--no-eager", help="Off: CUDA graphs + torch.compile (hooks then see less).")] = True,
    temperature: Annotated[float, typer.Option(min=0.0, help="0: greedy (no sampling kernel).")] = 0.0,
    top_k: Annotated[int, typer.Option(min=0, help="0: off.")] = 0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    single_process: Annotated[bool, typer.Option("--single-process", help="Engine core in this process.")] = False,
    attention_backend: Annotated[Optional[str], typer.Option(help="vLLM attention backend, e.g. TRITON_ATTN, FLASHINFER.")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(min=0.05, max=1.0)] = None,
    save_every: Annotated[float, typer.Option(min=0.0, help="Seconds between saves of each engine process's part (kept if the engine dies).")] = 10.0,
) -> None:
    """Run MODEL in a real engine and record every kernel-level call it makes."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        err.print("--model is required (try --model fi-profile/tiny-llama on CPU)")
        raise typer.Exit(code=2)
    if framework is Framework.sglang:
        err.print("SGLang capture is not built yet; use --framework vllm")
        raise typer.Exit(code=2)
    from profiler.capture.report import print_summary
    from profiler.capture.vllm_runner import EngineFailed, Scenario, run_vllm

    scenario = Scenario(num_prompts, input_len, output_len, batch_size, seed, temperature, top_k, top_p)
    try:
        summary, _, run = run_vllm(
            model, out_dir, scenario, load_format=load_format.value, dtype=dtype, tp=tp, eager=eager,
            max_workloads=max_workloads, single_process=single_process, attention_backend=attention_backend,
            gpu_memory_utilization=gpu_memory_utilization, autosave_s=save_every,
        )
    except EngineFailed as failed:
        if failed.summary is not None:
            print_summary(out, failed.summary, failed.run, out_dir)
        err.print(f"[red]{failed.run['incomplete']}[/red]" if failed.summary else f"[red]engine failed before any part was saved: {failed}[/red]")
        raise typer.Exit(code=1)
    assert summary is not None
    print_summary(out, summary, run, out_dir)


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
    from profiler.catalog import shipped_definitions_dir
    from profiler.validate import validate_paths

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
        raise typer.Exit(code=1)


@app.command()
def definitions(
    op_type: Annotated[Optional[str], typer.Option("--op-type", help="Only this op type.")] = None,
) -> None:
    """List the shipped kernel Definitions."""
    shipped = [d for d in shipped_definitions().values() if op_type in (None, d.op_type)]
    if not shipped:
        known = sorted({d.op_type for d in shipped_definitions().values()})
        err.print(f"no shipped definition has op type {op_type!r}; op types: {', '.join(known)}")
        raise typer.Exit(code=1)
    table = Table(title=f"{len(shipped)} shipped definitions")
    for column in ("op type", "name", "const axes", "var axes", "inputs → outputs"):
        table.add_column(column)
    for d in sorted(shipped, key=lambda d: (d.op_type, d.name)):
        table.add_row(
            d.op_type,
            d.name,
            " ".join(f"{k}={v}" for k, v in d.const_axes.items()),
            " ".join(d.var_axes),
            f"{', '.join(d.inputs)} → {', '.join(d.outputs)}",
        )
    out.print(table)


def main() -> None:  # pragma: no cover - console entry
    app()
