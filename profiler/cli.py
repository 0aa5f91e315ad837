"""The ``fi-profile`` command line."""

from __future__ import annotations

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
