"""Merge the per-process parts into the flashinfer-trace layout.

``DIR/record.json`` (Kernel Calling Record), ``DIR/definitions/{op_type}/{name}.json``,
``DIR/workloads/{op_type}/{name}.jsonl`` (capped per Definition: the most frequent half, the rest
spread over the axis values) and ``DIR/blob/workloads/...safetensors`` for index tensors.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from fi_profile.capture.recorder import PARTS_DIR
from fi_profile.schema import Definition, KernelCallingRecord, Trace
from fi_profile.workload_choice import choose_workloads


@dataclass
class CaptureSummary:
    record: KernelCallingRecord
    definitions: dict[str, Definition]
    distinct_workloads: Counter[str]  # distinct var-axis values seen
    errors: Counter[str] = field(default_factory=Counter)
    kept_workloads: Counter[str] = field(default_factory=Counter)  # written to workloads/ (at most --max-workloads)


def merge_parts(
    out_dir: Path, model: str, framework: str, max_workloads: int, run: dict[str, Any] | None = None
) -> CaptureSummary:
    parts = sorted((out_dir / PARTS_DIR).glob("*.json"))
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    ops: dict[str, str] = {}
    execution: dict[str, set[str]] = {}
    graph_runs: Counter[str] = Counter()
    padding: Counter[tuple[int, int]] = Counter()
    steps: Counter[str] = Counter()
    engine_steps = 0
    unseen: dict[str, int] = {}
    schedule: list[list[int]] = []
    definitions: dict[str, Definition] = {}
    workloads: dict[tuple[str, tuple], dict[str, Any]] = {}
    for part_path in parts:
        part = json.loads(part_path.read_text())
        calls.update(part["calls"])
        errors.update(part["errors"])
        lost.update(part.get("lost_calls", {}))
        ops.update(part.get("ops", {}))
        for name, where in part.get("execution", {}).items():
            execution.setdefault(name, set()).update(where)
        graph_runs.update(part.get("graph_runs", {}))
        for padded, real, n in part.get("padding", []):
            padding[(padded, real)] += n
        steps.update(part.get("steps", {}))
        engine_steps += part.get("engine_steps", 0)
        schedule = schedule or part.get("schedule", [])  # every rank runs the same steps
        for kind, layers in part.get("unseen_layers", {}).items():  # each rank has the same layers
            unseen[kind] = max(layers, unseen.get(kind, 0))
        for name, data in part["definitions"].items():
            definitions.setdefault(name, Definition.model_validate(data))
        blob = load_file(out_dir / part["blob"]) if part["blob"] else {}  # index tensors: small, read once
        for w in part["workloads"]:
            key = (w["definition"], tuple(sorted(w["axes"].items())))
            if key in workloads:
                workloads[key]["count"] += w["count"]
            else:
                workloads[key] = {**w, "tensors": {name: blob[k] for name, k in w["tensors"].items()}}
    by_definition: dict[str, list[dict[str, Any]]] = {}
    for w in workloads.values():
        by_definition.setdefault(w["definition"], []).append(w)
    distinct = Counter({name: len(ws) for name, ws in by_definition.items()})
    kept = Counter()
    for name, ws in by_definition.items():
        chosen = choose_workloads(ws, max_workloads, lambda w: w["count"], lambda w: w["axes"])
        kept[name] = len(chosen)
        _write_workloads(out_dir, definitions[name], chosen)
    for definition in definitions.values():
        path = out_dir / "definitions" / definition.op_type / f"{definition.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(definition.to_json())
    run_block = {**(run or {}), "processes": len(parts), "hook_errors": dict(errors), "steps": dict(steps)}
    if engine_steps:  # steps whose forward ran (every rank's), seen at the engine's step method
        run_block["steps"]["engine"] = engine_steps
    if schedule:  # the steps in order: [tokens, requests, decoding, prefilling, consecutive steps]
        run_block["schedule"] = schedule
    run_block["execution"] = {name: " and ".join(sorted(where)) for name, where in sorted(execution.items())}
    if graph_runs:  # compiled forwards: how each ran, and the padded sizes beside the scheduled ones
        run_block["steps"]["compiled_forward"] = dict(sorted(graph_runs.items()))
        run_block["padded_tokens"] = [
            {"ran_with": padded, "scheduled": real, "runs": n} for (padded, real), n in sorted(padding.items())
        ]
    if unseen:
        run_block["not_covered"] = dict(sorted({**run_block.get("not_covered", {}), **unseen}.items()))
        if run is not None:
            run["not_covered"] = run_block["not_covered"]
    gaps = [run_block["incomplete"]] if run_block.get("incomplete") else []  # the engine died mid-run
    if errors:
        impact = hook_error_impact(errors, lost, ops)
        gaps.append(impact.pop("incomplete"))
        run_block.update(impact)
    if run_block.get("hooks_missing"):  # this engine version lacks them: whatever they record is not in the record
        gaps.append(f"hook points not found (their calls are not in the record): {', '.join(run_block['hooks_missing'])}")
    if run_block.get("not_covered"):
        layers = ", ".join(f"{n} x {kind}" for kind, n in run_block["not_covered"].items())
        gaps.append(f"layers whose kernels no hook records (not in the record): {layers}")
    if run_block.get("inexact"):
        layers = ", ".join(f"{n} x {kind}" for kind, n in run_block["inexact"].items())
        gaps.append(f"layers recorded at other shapes than their kernels ran: {layers}")
    if gaps:
        run_block["incomplete"] = "; ".join(gaps)
        if run is not None:  # the caller's run block says it too (the summary and the exit code read it)
            run["incomplete"] = run_block["incomplete"]
    record = KernelCallingRecord.model_validate(
        {
            "model": model,
            "framework": framework,
            "kernels": [{"id": n, "count": c} for n, c in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))],
            "run": run_block,
        }
    )
    (out_dir / "record.json").write_text(record.model_dump_json(indent=2, exclude_none=True) + "\n")
    return CaptureSummary(record, definitions, distinct, errors, kept)


def hook_error_impact(errors: Counter[str], lost: Counter[str], ops: dict[str, str]) -> dict[str, Any]:
    """What hook errors cost the record: per op, the hooked invocations whose calls are unknown and
    the recorded Definitions of that op whose counts are therefore low (a Definition that every
    invocation failed to match is not in the record at all), and one line saying so."""
    affected = {op: sorted(name for name, of in ops.items() if of == op) for op in sorted(lost)}
    parts = []
    for op, names in affected.items():
        which = f"counts of {', '.join(names)} are low" if names else "none of its calls is in the record"
        parts.append(f"{lost[op]} {op} call(s) not recorded ({which})")
    other = sum(count for message, count in errors.items() if message.split(":", 1)[0] not in lost)
    if other:
        parts.append(f"{other} other hook error(s): counts may be off")
    impact: dict[str, Any] = {"calls_lost": dict(sorted(lost.items())), "affected_definitions": affected}
    impact["incomplete"] = "hook errors: " + "; ".join(parts) + " (run.hook_errors has the messages)"
    return impact


def _write_workloads(out_dir: Path, definition: Definition, chosen: list[dict[str, Any]]) -> None:
    lines = []
    for w in chosen:
        workload_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{definition.name}:{sorted(w['axes'].items())}"))
        inputs: dict[str, Any] = {name: {"type": "random"} for name in definition.inputs}
        for name, value in w["scalars"].items():
            inputs[name] = {"type": "scalar", "value": value}
        if w["tensors"]:
            name = f"{definition.name}_{workload_id}.safetensors"
            rel = Path("blob") / "workloads" / definition.op_type / definition.name / name
            (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            save_file(w["tensors"], str(out_dir / rel))
            for name in w["tensors"]:
                inputs[name] = {"type": "safetensors", "path": f"./{rel.as_posix()}", "tensor_key": name}
        trace = Trace.model_validate(
            {
                "definition": definition.name,
                "solution": None,
                "evaluation": None,
                "workload": {"uuid": workload_id, "axes": w["axes"], "inputs": inputs, "count": w["count"]},
            }
        )
        lines.append(trace.model_dump_json(exclude_none=False))
    path = out_dir / "workloads" / definition.op_type / f"{definition.name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
