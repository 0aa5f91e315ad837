"""A capture's options, as one object handed from the command line down to the engine run, and
the table of engines (each one folder under ``hooks/``, whose runner module names its engine)."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from fi_profile.capture.engine_run import Scenario

#: framework -> its runner module: ``ENGINE`` (the :class:`~fi_profile.capture.engine_run.Engine`
#: class) and ``OWN_ARGUMENTS`` (the engine constructor's arguments fi-profile sets itself)
ENGINE_RUNNERS = {
    "vllm": "fi_profile.hooks.vllm.runner",
    "sglang": "fi_profile.hooks.sglang.runner",
}


def engine_runner(framework: str) -> ModuleType:
    """The runner module of ``framework`` (imported only when that engine runs)."""
    return importlib.import_module(ENGINE_RUNNERS[framework])


@dataclass(frozen=True)
class EngineOptions:
    """What the engine is built with (each engine's constructor reads what it has: SGLang has no
    ``single_process`` or ``kv_cache_bytes``)."""

    load_format: str = "dummy"
    dtype: str = "bfloat16"
    tp: int = 1
    eager: bool = True
    single_process: bool = False
    attention_backend: Optional[str] = None
    gpu_memory_utilization: Optional[float] = None
    kv_cache_bytes: Optional[int] = None
    #: other arguments of the engine's constructor, by name (``--engine-arg``)
    engine_args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureOptions:
    """One capture: the model, where its output goes, what it generates, the engine's options, and
    what is kept."""

    model: str
    out_dir: Path
    scenario: Scenario
    engine: EngineOptions = field(default_factory=EngineOptions)
    #: workloads written per Definition (:mod:`fi_profile.workload_choice`)
    max_workloads: int = 32
    #: calls per Definition only, no workloads
    count_only: bool = False
    #: seconds between saves of each engine process's part
    autosave_s: float = 10.0
    #: False: the same engine run without recording (the A/B baseline)
    capture: bool = True
    #: the engine's kernels measured and attributed to Definitions (``run.engine_kernels``)
    kernel_accounting: bool = True
    #: on a GPU, the attributed share of the engine's kernel time below which the record is incomplete
    min_attributed: float = 0.95

    @classmethod
    def of(cls, model: str, out_dir: Path, scenario: Scenario, **options: Any) -> "CaptureOptions":
        """Options by name, each to the engine's options or the capture's (an unknown one is a
        ``TypeError`` naming it)."""
        engine_names = {f.name for f in dataclasses.fields(EngineOptions)}
        engine = EngineOptions(**{k: v for k, v in options.items() if k in engine_names})
        return cls(model, Path(out_dir), scenario, engine, **{k: v for k, v in options.items() if k not in engine_names})
