"""Merge the per-process parts into the flashinfer-trace layout.

``DIR/record.json`` (Kernel Calling Record), ``DIR/definitions/{op_type}/{name}.json``,
``DIR/workloads/{op_type}/{name}.jsonl`` (capped per Definition: the most frequent half, the rest
spread over the axis values) and ``DIR/blob/workloads/...safetensors`` for index tensors.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from safetensors.torch import load_file, save_file

from fi_profile.capture.completeness import judged
from fi_profile.capture.kernel_accounting import merged
from fi_profile.capture.recorder import PARTS_DIR
from fi_profile.schema import Definition, KernelCallingRecord, KernelCount, Trace
from fi_profile.schema.run_info import PaddedTokens, RunInfo, StepCounts, UnkeptWorkload
from fi_profile.workload_choice import choose_workloads


@dataclass
class CaptureSummary:
    record: KernelCallingRecord
    definitions: dict[str, Definition]
    distinct_workloads: Counter[str]  # distinct var-axis values seen
    errors: Counter[str] = field(default_factory=Counter)
    kept_workloads: Counter[str] = field(default_factory=Counter)  # written to workloads/ (at most --max-workloads)


def write_atomically(path: Path, text: str) -> None:
    """``path`` holding ``text``, written whole or not at all: to a temporary file beside it, then
    renamed over it (a capture killed while it writes leaves the previous file, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def merge_parts(out_dir: Path, model: str, framework: str, max_workloads: int, run: Optional[RunInfo] = None,
                died: Optional[str] = None) -> CaptureSummary:
    """Merge the processes' parts in ``out_dir`` into the record and its files. ``run``: how the run
    was made (the record's ``run`` block, completed here with what the processes recorded);
    ``died``: the engine died mid-run, as this says."""
    parts = [json.loads(path.read_text()) for path in sorted((out_dir / PARTS_DIR).glob("*.json"))]
    merged = _Merged()
    definitions: dict[str, Definition] = {}
    workloads: dict[tuple[str, tuple], dict[str, Any]] = {}
    for part in parts:
        merged.add(part)
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
    unkept: dict[str, list[UnkeptWorkload]] = {}
    for name, ws in by_definition.items():
        chosen = choose_workloads(ws, max_workloads, lambda w: w["count"], lambda w: w["axes"])
        kept[name] = len(chosen)
        _write_workloads(out_dir, definitions[name], chosen)
        written = {id(w) for w in chosen}
        left = sorted((w for w in ws if id(w) not in written), key=lambda w: sorted(w["axes"].items()))
        if left:
            unkept[name] = [UnkeptWorkload(axes=w["axes"], count=w["count"]) for w in left]
    for definition in definitions.values():
        path = out_dir / "definitions" / definition.op_type / f"{definition.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, definition.to_json())
    run_block = merged.run_block(run or RunInfo(), len(parts))
    if unkept:
        run_block = run_block.model_copy(update={"unkept_workloads": dict(sorted(unkept.items()))})
    run_block = judged(run_block, died)
    record = KernelCallingRecord(
        model=model,
        framework=framework,
        kernels=[KernelCount(id=n, count=c) for n, c in sorted(merged.calls.items(), key=lambda kv: (-kv[1], kv[0]))],
        run=run_block,
    )
    write_atomically(out_dir / "record.json", record.model_dump_json(indent=2, exclude_none=True) + "\n")
    return CaptureSummary(record, definitions, distinct, merged.errors, kept)


@dataclass
class _Merged:
    """The counters of every process's part, summed (or, for what each rank has alike, taken once)."""

    calls: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)
    ops: dict[str, str] = field(default_factory=dict)
    execution: dict[str, set[str]] = field(default_factory=dict)
    graph_runs: Counter[str] = field(default_factory=Counter)
    padding: Counter[tuple[int, int]] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    engine_steps: int = 0
    unseen: dict[str, int] = field(default_factory=dict)
    schedule: list[list[int]] = field(default_factory=list)
    engine_kernels: list[dict[str, Any]] = field(default_factory=list)

    def add(self, part: dict[str, Any]) -> None:
        self.calls.update(part["calls"])
        self.errors.update(part["errors"])
        self.lost.update(part.get("lost_calls", {}))
        self.ops.update(part.get("ops", {}))
        for name, where in part.get("execution", {}).items():
            self.execution.setdefault(name, set()).update(where)
        self.graph_runs.update(part.get("graph_runs", {}))
        for padded, real, n in part.get("padding", []):
            self.padding[(padded, real)] += n
        self.steps.update(part.get("steps", {}))
        self.engine_steps += part.get("engine_steps", 0)
        self.schedule = self.schedule or part.get("schedule", [])  # every rank runs the same steps
        for kind, layers in part.get("unseen_layers", {}).items():  # each rank has the same layers
            self.unseen[kind] = max(layers, self.unseen.get(kind, 0))
        if part.get("engine_kernels"):
            self.engine_kernels.append(part["engine_kernels"])

    def run_block(self, run: RunInfo, processes: int) -> RunInfo:
        """``run`` with what the processes recorded (completeness is judged after)."""
        steps = dict(self.steps)
        if self.engine_steps:  # steps whose forward ran (every rank's), seen at the engine's step method
            steps["engine"] = self.engine_steps
        if self.graph_runs:  # compiled forwards: how each ran
            steps["compiled_forward"] = dict(sorted(self.graph_runs.items()))
        update: dict[str, Any] = {
            "processes": processes,
            "hook_errors": dict(self.errors),
            "steps": StepCounts.model_validate(steps),
            "schedule": self.schedule or None,  # [tokens, requests, decoding, prefilling, consecutive steps]
            "execution": {name: " and ".join(sorted(where)) for name, where in sorted(self.execution.items())},
        }
        if self.graph_runs:  # the padded sizes beside the scheduled ones
            update["padded_tokens"] = [PaddedTokens(ran_with=padded, scheduled=real, runs=n)
                                       for (padded, real), n in sorted(self.padding.items())]
        if self.engine_kernels:  # every rank's kernels, summed
            update["engine_kernels"] = merged(self.engine_kernels)
        if self.unseen:
            update["not_covered"] = dict(sorted({**(run.not_covered or {}), **self.unseen}.items()))
        if self.errors:  # per op, the invocations lost and the Definitions of that op whose counts are low
            update["calls_lost"] = dict(sorted(self.lost.items()))
            update["affected_definitions"] = {op: sorted(name for name, of in self.ops.items() if of == op)
                                              for op in sorted(self.lost)}
        return run.model_copy(update=update)


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
    write_atomically(path, "\n".join(lines) + "\n")
