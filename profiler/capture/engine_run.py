"""What every engine runner shares: the scenario, where the model comes from, the run block of
the record, and how a run ends (merged parts, or what was saved when the engine died)."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from profiler.capture.output import CaptureSummary, merge_parts
from profiler.capture.recorder import PARTS_DIR

TINY_MODEL = "fi-profile/tiny-llama"


@dataclass(frozen=True)
class Scenario:
    num_prompts: int = 4
    input_len: int = 32
    output_len: int = 8
    batch_size: int = 256
    seed: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass
class ModelSource:
    path: str  # what the engine loads: a local folder or a hub id
    shipped: bool  # a config shipped with fi-profile (no weights, no tokenizer)


def resolve_model(model: str) -> ModelSource:
    """A local folder, a model whose config fi-profile ships, or a hub id left to the engine."""
    if Path(model).is_dir():
        return ModelSource(str(Path(model).resolve()), shipped=False)
    shipped = resources.files("profiler") / "model_configs" / model / "config.json"
    if shipped.is_file():
        return ModelSource(str(Path(str(shipped)).parent), shipped=True)
    return ModelSource(model, shipped=False)


def prompts_for(scenario: Scenario, vocab_size: int) -> list[list[int]]:
    rng = random.Random(scenario.seed)
    return [[rng.randrange(vocab_size) for _ in range(scenario.input_len)] for _ in range(scenario.num_prompts)]


class EngineFailed(RuntimeError):
    """The engine failed mid-run; ``summary`` merges what its processes had saved."""

    def __init__(self, message: str, summary: CaptureSummary | None, run: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary, self.run = summary, run


def run_info(engine: str, scenario: Scenario, options: dict[str, Any], attention_backend: str, hooks_missing: list[str]) -> dict[str, Any]:
    """The record's ``run`` block: engine, eager or graphs, weights, dtype, TP, scenario, missing hooks."""
    eager = options.get("eager", True)
    load_format = options.get("load_format", "dummy")
    return {
        "engine": engine,
        "eager": eager,
        "cuda_graphs_and_torch_compile": not eager,
        "weights": "dummy (random)" if load_format == "dummy" else load_format,
        "dtype": options.get("dtype", "bfloat16"),
        "tensor_parallel": options.get("tp", 1),
        "attention_backend": attention_backend,
        "scenario": asdict(scenario),
        "hooks_missing": sorted(hooks_missing),
    }


def fail_with_saved_parts(out_dir: Path, model: str, framework: str, max_workloads: int, run: dict[str, Any], failure: str) -> None:
    """The engine died mid-run: merge what its processes saved and raise :class:`EngineFailed`."""
    run["incomplete"] = f"engine failed mid-run ({failure[:500]}); the record holds the steps saved before"
    saved = any((out_dir / PARTS_DIR).glob("*.json"))
    summary = merge_parts(out_dir, model, framework, max_workloads, run) if saved else None
    raise EngineFailed(failure, summary, run)


def clear_output(out_dir: Path) -> None:
    """Remove what an earlier capture left in ``out_dir`` (only the parts fi-profile writes)."""
    for sub in (".fi-profile", "workloads", "definitions", "blob"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    (out_dir / "record.json").unlink(missing_ok=True)


def cpu_thread_binding(workers: int) -> str:
    """The CPU engines' thread binding (``VLLM_CPU_OMP_THREADS_BIND``,
    ``SGLANG_CPU_OMP_THREADS_BIND``) for ``workers`` ranks: the allowed cores split in order (both
    bind one NUMA node per rank by themselves, and refuse when there are fewer nodes)."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // workers)
    groups = [cores[i * share : (i + 1) * share] or [cores[i % len(cores)]] for i in range(workers)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)
