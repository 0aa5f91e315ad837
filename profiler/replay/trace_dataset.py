"""A replay's results folder as a flashinfer-trace dataset, so that flashinfer-bench's own tools
(``TraceSet.from_path(RESULTS)``, its reports and leaderboard) read what replay measured.

Beside ``results.jsonl`` (seed-001 Benchmark Results), the folder holds, in flashinfer-trace's
layout (``../shared/flashinfer-trace/``, flashinfer-bench 0.1.2's ``TraceSet``):

- ``definitions/{op_type}/{name}.json``: the Definitions replayed;
- ``workloads/{op_type}/{name}.jsonl``: their workloads replayed, with the captured tensors they
  name copied under ``blob/`` (paths are relative to the dataset root);
- ``solutions/{op_type}/{definition}/{solution}.json``: every solution replayed, the shipped
  baselines and the engines' natives included, in flashinfer-bench's form;
- ``traces/{op_type}/{definition}.jsonl``: one Trace per (workload, solution) that ran: the
  workload, the solution's name and its evaluation (status, correctness, performance,
  environment), appended as each workload's pairs finish.
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path
from typing import Iterable, Optional

from fi_profile.capture.output import write_atomically
from fi_profile.replay.dataset import Dataset
from fi_profile.schema import BenchmarkResult, Definition, Solution, Trace, Workload
from fi_profile.schema.benchmark_result import Status
from fi_profile.schema.solution import Language
from fi_profile.schema.workload import (
    Correctness,
    Environment,
    Evaluation,
    EvaluationStatus,
    Performance,
    SafetensorsInput,
)

REFERENCE = "reference"

#: replay's statuses in flashinfer-bench's terms; a wrong output of another kind (an input
#: written, an output that does not follow its inputs) is a numerical error there, its log says which
STATUS = {
    Status.passed: EvaluationStatus.passed,
    Status.incorrect_shape: EvaluationStatus.incorrect_shape,
    Status.incorrect_dtype: EvaluationStatus.incorrect_dtype,
    Status.incorrect_numerical: EvaluationStatus.incorrect_numerical,
    Status.mutates_input: EvaluationStatus.incorrect_numerical,
    Status.stale_output: EvaluationStatus.incorrect_numerical,
    Status.runtime_error: EvaluationStatus.runtime_error,
    Status.crashed: EvaluationStatus.runtime_error,
    Status.timeout: EvaluationStatus.timeout,
    Status.compile_error: EvaluationStatus.compile_error,
}


def write_dataset(out_dir: Path, dataset: Dataset, solutions: dict[str, list[Solution]]) -> None:
    """The Definitions, workloads (and their blobs) and solutions of a replay; ``solutions``:
    per Definition, those it replays. The traces start empty (:func:`append_traces` fills them).
    Results written into the dataset's own folder leave its Definitions and workloads as they are
    (a replay of some of them must not replace the rest)."""
    inside = out_dir.resolve() == dataset.root.resolve()
    for name, definition in dataset.definitions.items():
        workloads = dataset.workloads.get(name, [])
        if not workloads:
            continue
        if not inside:
            write_atomically(out_dir / "definitions" / definition.op_type / f"{name}.json", definition.to_json())
            lines = [Trace(definition=name, workload=w).model_dump_json(exclude_none=True) for w in workloads]
            write_atomically(out_dir / "workloads" / definition.op_type / f"{name}.jsonl", "\n".join(lines) + "\n")
            for workload in workloads:
                _copy_blobs(workload, dataset.root, out_dir)
        for solution in solutions.get(name, []):
            write_atomically(out_dir / "solutions" / definition.op_type / name / f"{solution.name}.json",
                   solution_document(solution, definition))
        traces = out_dir / "traces" / definition.op_type / f"{name}.jsonl"
        traces.parent.mkdir(parents=True, exist_ok=True)
        traces.write_text("")


def append_traces(out_dir: Path, definition: Definition, workload: Workload,
                  results: Iterable[BenchmarkResult]) -> None:
    """The Traces of one workload's results (the reference's aside: it is no solution)."""
    lines = [trace_of(r, workload).model_dump_json(exclude_none=True) for r in results if r.source != REFERENCE]
    if lines:
        with (out_dir / "traces" / definition.op_type / f"{definition.name}.jsonl").open("a") as f:
            f.write("\n".join(lines) + "\n")


def trace_of(result: BenchmarkResult, workload: Workload, timestamp: Optional[str] = None) -> Trace:
    """One Benchmark Result as a flashinfer-bench Trace of its workload."""
    assert result.status is not None, "a replay result has a status"
    status = STATUS[result.status]
    log = [] if status.name == result.status.name else [f"fi-profile status: {result.status.value}"]
    if result.error:
        log.append(result.error)
    check = result.check
    correctness = Correctness(max_relative_error=check.max_rel_diff, max_absolute_error=check.max_abs_diff) \
        if check is not None else None
    if status in (EvaluationStatus.passed, EvaluationStatus.incorrect_numerical) and correctness is None:
        status = EvaluationStatus.runtime_error  # flashinfer-bench needs the errors there; none was measured
        log.append("no comparison with the reference was recorded")
    performance = None
    if status is EvaluationStatus.passed:
        assert result.time is not None
        performance = Performance(latency_ms=result.time, reference_latency_ms=result.reference_time or 0.0,
                                  speedup_factor=result.speedup or 0.0)
        if result.timing is not None:
            log.append(f"timed by {result.timing.method}: median of {result.timing.repetitions} calls, "
                       f"cv {result.timing.cv:.3f}")
    return Trace(
        definition=result.kernel_id,
        solution=result.source,
        workload=workload,
        evaluation=Evaluation(
            status=status,
            log="\n".join(log),
            correctness=correctness if status in (EvaluationStatus.passed, EvaluationStatus.incorrect_numerical)
            else None,
            performance=performance,
            environment=Environment(hardware=result.device.name.replace(" ", "_"), libs=result.libs),
            timestamp=timestamp or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        ),
    )


def solution_document(solution: Solution, definition: Definition) -> str:
    """A Solution in flashinfer-bench's form: its languages have no ``torch_compile`` (written as
    ``python`` with ``torch_compile: true``, which fi-profile reads back), it names the hardware,
    and it says whether the entry point takes the outputs (``destination_passing_style``)."""
    document = solution.model_dump(mode="json", exclude_none=True)
    spec = document["spec"]
    if solution.spec.language is Language.torch_compile:
        spec["language"], spec["torch_compile"] = Language.python.value, True
    spec["target_hardware"] = spec.get("target_hardware") or ["cuda"]
    spec.pop("destination_passing", None)
    spec["destination_passing_style"] = (solution.is_destination_passing(list(definition.inputs),
                                                                          list(definition.outputs))
                                         if solution.spec.language.entry_is_python
                                         else bool(solution.spec.destination_passing))
    return json.dumps(document, indent=1) + "\n"


def _copy_blobs(workload: Workload, root: Path, out_dir: Path) -> None:
    for source in workload.inputs.values():
        if isinstance(source, SafetensorsInput):
            src, dst = root / source.path, out_dir / source.path
            if src.is_file() and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
