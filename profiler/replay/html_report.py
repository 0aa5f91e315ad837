"""``RESULTS/report.html``: one self-contained page of a replay, for people who would rather see
than read. Plotly's JavaScript and every figure's data are inline: the page makes no network
request and opens from a file.

Sections: the engine's kernel time per Definition, measured in the capture beside the projection
with the kernels the engine ran (their ratio and SM clocks in the hover); each Definition's
solutions over its workloads (time against the workload's input size, a line per solution); the
captured shapes (each var axis's values weighed by the calls that had them, and the engine's steps,
prefill against decode); what the capture did not attribute and what the record says it misses.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

from fi_profile.capture.output import write_atomically
from fi_profile.replay.projection import KernelProjection, MeasuredRow
from fi_profile.replay.runner import REFERENCE, label_of
from fi_profile.replay.workload_size import input_size
from fi_profile.schema import BenchmarkResult, Definition, KernelCallingRecord, Workload

FILE = "report.html"


def available() -> Optional[str]:
    """None where Plotly imports, else why the report cannot be written."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        return "Plotly is not installed here (pip install plotly)"
    return None


def write_report(out_dir: Path, results: list[BenchmarkResult], definitions: dict[str, Definition],
                 workloads: dict[str, list[Workload]], record: Optional[KernelCallingRecord],
                 projection: list[KernelProjection], measured: list[MeasuredRow]) -> Path:
    """The page, written whole (a temporary file renamed); ``workloads``: every captured workload
    (their counts weigh the shape figures); ``projection``/``measured``: the replay's projections."""
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs

    sections: list[tuple[str, str, list[tuple[str, Any]]]] = []  # (id, title, [(caption, figure)])
    if measured:
        sections.append(("measured", "Engine kernel time per Definition: measured and projected",
                         [("", _measured_figure(go, measured))]))
    elif projection:
        sections.append(("projection", "Kernel time per the captured calls",
                         [("", _projection_figure(go, projection))]))
    by_definition: dict[str, list[BenchmarkResult]] = defaultdict(list)
    for r in results:
        by_definition[r.kernel_id].append(r)
    axes_of = {w.uuid: w.axes for ws in workloads.values() for w in ws}
    sections.append(("solutions", "Solutions over each Definition's workloads",
                     [(name, _solutions_figure(go, definitions[name], rs, axes_of))
                      for name, rs in by_definition.items() if name in definitions]))
    shapes = [(name, _shapes_figure(go, definitions[name], ws)) for name, ws in workloads.items()
              if name in by_definition and name in definitions and definitions[name].var_axes]
    steps = _steps_figure(go, record)
    sections.append(("shapes", "Captured shapes", ([("steps", steps)] if steps is not None else []) + shapes))
    sections.append(("missing", "What is not attributed, and what the record misses",
                     [("", _unattributed_figure(go, record))]))
    page = _page(get_plotlyjs(), record, sections, _misses(record))
    path = out_dir / FILE
    write_atomically(path, page)
    return path


def _layout(title: str, x: str, y: str, **more: Any) -> dict:
    return {"title": {"text": title}, "xaxis": {"title": {"text": x}}, "yaxis": {"title": {"text": y}},
            "height": 420, "margin": {"l": 70, "r": 20, "t": 50, "b": 60}, **more}


def _measured_figure(go: Any, rows: list[MeasuredRow]) -> Any:
    names = [" + ".join(r.kernels) for r in rows]
    hover = [f"{n}<br>engine's kernel: {html.escape(r.engine)}<br>projected / measured: "
             f"{r.ratio:.2f}" if r.ratio is not None else f"{n}<br>not replayed: {html.escape(r.engine)}"
             for n, r in zip(names, rows)]
    clocks = [f"SM clock engine {r.engine_mhz or 0:,.0f} / replay {r.replay_mhz or 0:,.0f} MHz"
              + (f"<br>at the engine's clock: × {r.ratio_at_engine_clock:.2f}"
                 if r.ratio_at_engine_clock is not None else "") for r in rows]
    figure = go.Figure([
        go.Bar(name="measured in the capture", y=names, x=[r.measured_ms for r in rows], orientation="h",
               hovertext=[f"{h}<br>{c}" for h, c in zip(hover, clocks)]),
        go.Bar(name="projected with the engine's kernels", y=names, x=[r.projected_ms for r in rows],
               orientation="h", text=[f"× {r.ratio:.2f}" if r.ratio is not None else "not replayed" for r in rows],
               textposition="outside", hovertext=[f"{h}<br>{c}" for h, c in zip(hover, clocks)]),
    ])
    figure.update_layout(**_layout("", "ms over the captured steps", "", barmode="group",
                                   height=max(320, 44 * len(rows) + 140), legend={"orientation": "h", "y": 1.08}))
    figure.update_yaxes(autorange="reversed", automargin=True)
    longest = max([r.measured_ms for r in rows] + [r.projected_ms or 0.0 for r in rows], default=0.0)
    if longest > 0:  # room right of the longest bar for its ratio ("× 1.01" was cut to "× 1.0")
        figure.update_xaxes(range=[0, longest * 1.12])
    return figure


def _projection_figure(go: Any, rows: list[KernelProjection]) -> Any:
    rows = [r for r in rows if r.baseline_ms is not None]
    names = [r.kernel for r in rows]
    figure = go.Figure([
        go.Bar(name="baseline", y=names, x=[r.count * r.baseline_ms for r in rows], orientation="h",  # type: ignore[operator]
               hovertext=[label_of(r.baseline or "") for r in rows]),
        go.Bar(name="best", y=names, orientation="h",
               x=[r.count * (r.best_ms if r.best_ms is not None else r.baseline_ms) for r in rows],  # type: ignore[operator]
               hovertext=[label_of(r.best or "") for r in rows]),
    ])
    figure.update_layout(**_layout("", "ms over the captured calls", "", barmode="group",
                                   height=max(320, 44 * len(rows) + 140), legend={"orientation": "h", "y": 1.08}))
    figure.update_yaxes(autorange="reversed", automargin=True)
    return figure


def _solutions_figure(go: Any, definition: Definition, results: list[BenchmarkResult],
                      axes_of: dict[str, dict[str, int]]) -> Any:
    by_source: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    for r in results:
        if r.time is None or r.workload not in axes_of:
            failed[r.source] += r.time is None
            continue
        axes = axes_of[r.workload]
        by_source[r.source].append((input_size(definition, axes), r.time,
                                    ", ".join(f"{k}={v}" for k, v in axes.items())))
    traces = []
    for source, points in sorted(by_source.items(), key=lambda kv: kv[0] != REFERENCE):
        points.sort()
        label = label_of(source) + (f" ({failed[source]} failed)" if failed.get(source) else "")
        traces.append(go.Scatter(name=label, x=[p[0] for p in points], y=[p[1] for p in points],
                                 mode="lines+markers", hovertext=[p[2] for p in points]))
    figure = go.Figure(traces)
    figure.update_layout(**_layout(definition.name, "workload input size (elements)", "median ms per call"))
    figure.update_xaxes(type="log")
    figure.update_yaxes(type="log")
    return figure


def _shapes_figure(go: Any, definition: Definition, workloads: list[Workload]) -> Any:
    traces = []
    for axis in definition.var_axes:
        calls: dict[int, int] = defaultdict(int)
        for w in workloads:
            if axis in w.axes:
                calls[w.axes[axis]] += w.count or 1
        values = sorted(calls)
        traces.append(go.Bar(name=axis, x=[str(v) for v in values], y=[calls[v] for v in values]))
    figure = go.Figure(traces)
    figure.update_layout(**_layout(f"{definition.name}: var-axis values by calls", "value", "calls",
                                   barmode="group"))
    figure.update_xaxes(type="category")
    return figure


def _steps_figure(go: Any, record: Optional[KernelCallingRecord]) -> Any:
    """The engine's steps (``run.schedule``: tokens, requests, decoding, prefilling, repeats):
    tokens per step, prefill, decode and mixed steps apart."""
    schedule = (record.run.schedule if record is not None and record.run is not None else None) or []
    if not schedule:
        return None
    kinds: dict[str, tuple[list[int], list[int]]] = {"prefill": ([], []), "decode": ([], []), "mixed": ([], [])}
    for tokens, _requests, decoding, prefilling, repeats in schedule:
        kind = "mixed" if decoding and prefilling else "prefill" if prefilling else "decode"
        kinds[kind][0].append(tokens)
        kinds[kind][1].append(repeats)
    traces = []
    for kind, (tokens, repeats) in kinds.items():
        steps: dict[int, int] = defaultdict(int)
        for t, n in zip(tokens, repeats):
            steps[t] += n
        if steps:
            values = sorted(steps)
            traces.append(go.Bar(name=f"{kind} steps", x=[str(v) for v in values], y=[steps[v] for v in values]))
    figure = go.Figure(traces)
    figure.update_layout(**_layout("the engine's steps by tokens scheduled", "tokens in the step", "steps",
                                   barmode="stack"))
    figure.update_xaxes(type="category", categoryorder="array",
                        categoryarray=[str(v) for v in sorted({int(x) for t in traces for x in t.x})])
    return figure


def _unattributed_figure(go: Any, record: Optional[KernelCallingRecord]) -> Any:
    kernels = record.run.engine_kernels if record is not None and record.run is not None else None
    rest = (kernels.unattributed if kernels is not None else [])[:30]
    bars = []
    if kernels is not None:
        model_ms = kernels.total_ms - (kernels.engine_work_ms or 0.0)
        bars.append(("attributed to Definitions", kernels.attributed_share * model_ms,
                     f"{100 * kernels.attributed_share:.1f}% of the model's {model_ms:,.1f} ms"))
        if kernels.engine_work_ms is not None:
            own = ", ".join(f"{k.name[:60]} {k.ms:,.2f} ms" for k in (kernels.engine_work or [])[:5])
            bars.append(("the engine's own work (outside the model's forwards)", kernels.engine_work_ms, own))
    bars += [(k.name[:80], k.ms, f"{k.calls} calls, {100 * k.share:.1f}% of the model's") for k in rest]
    names = [name for name, _, _ in bars]
    figure = go.Figure([go.Bar(x=[ms for _, ms, _ in bars], y=names, orientation="h",
                               hovertext=[how for _, _, how in bars])])
    title = ("the engine's kernel time, attributed and not" if kernels is not None
             else "the capture measured no engine kernel time")
    figure.update_layout(**_layout(title, "ms", "", height=max(300, 24 * len(names) + 120)))
    figure.update_yaxes(autorange="reversed", automargin=True)
    return figure


def _misses(record: Optional[KernelCallingRecord]) -> list[str]:
    """What the record says it misses, one line each."""
    run = record.run if record is not None else None
    if run is None:
        return ["no record.json: the dataset is not a capture"]
    lines = [f"incomplete: {run.incomplete}"] if run.incomplete else []
    lines += [f"hook point not found: {name}" for name in run.hooks_missing or ()]
    lines += [f"{n} × {kind}: no hook records its kernels" for kind, n in (run.not_covered or {}).items()]
    lines += [f"{n} × {kind}: recorded at other shapes than it ran" for kind, n in (run.inexact or {}).items()]
    lines += [f"{n} hook error(s): {message}" for message, n in (run.hook_errors or {}).items()]
    return lines or ["nothing: the record says it is complete"]


def _page(plotly_js: str, record: Optional[KernelCallingRecord],
          sections: list[tuple[str, str, list[tuple[str, Any]]]], misses: list[str]) -> str:
    title = f"fi-profile replay: {record.model} on {record.framework.value}" if record is not None else "fi-profile replay"
    body, figures = [], []
    for sid, heading, items in sections:
        body.append(f'<section id="{sid}"><h2>{html.escape(heading)}</h2>')
        if sid == "missing":
            body.append("<ul class=\"misses\">" + "".join(f"<li>{html.escape(m)}</li>" for m in misses) + "</ul>")
        for caption, figure in items:
            div = f"plot-{len(figures)}"
            figures.append((div, figure.to_json()))
            label = f' data-definition="{html.escape(caption)}"' if caption else ""
            body.append(f'<div class="plot" id="{div}"{label}></div>')
        body.append("</section>")
    draw = "\n".join(f"Plotly.newPlot({json.dumps(div)}, ...unpack({spec}));" for div, spec in figures)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px}} .plot{{margin:1em 0}}
h2{{border-bottom:1px solid #ccc}}</style>
<script>{plotly_js}</script></head>
<body data-plots="{len(figures)}"><h1>{html.escape(title)}</h1>
{''.join(body)}
<script>
function unpack(spec) {{ return [spec.data, Object.assign(spec.layout, {{}}), {{responsive: true, displaylogo: false}}]; }}
{draw}
</script></body></html>
"""
