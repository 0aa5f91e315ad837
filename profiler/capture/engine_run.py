"""What every engine runner shares: the scenario, where the model comes from, the run block of
the record, and how a run ends (merged parts, or what was saved when the engine died)."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from fi_profile.capture.completeness import judged
from fi_profile.capture.engine_failure import keep_traceback, log_size, said_of, with_root_cause
from fi_profile.capture.engine_output import ENGINE_LOG
from fi_profile.capture.interruption import Interrupted
from fi_profile.capture.kernel_accounting import prepare as prepare_accounting
from fi_profile.capture.lengths import Length, draw_lengths
from fi_profile.capture.output import CaptureSummary, merge_parts
from fi_profile.capture.parent_watch import kill_engine_processes
from fi_profile.capture.recorder import PARTS_DIR
from fi_profile.schema.run_info import RunInfo

if TYPE_CHECKING:
    from fi_profile.capture.options import CaptureOptions

TINY_MODEL = "fi-profile/tiny-llama"


@dataclass(frozen=True)
class Scenario:
    """What a capture generates. ``input_len`` / ``output_len`` are the longest prompt and output;
    with ``input_len_min`` / ``output_len_min`` each request's length is drawn (seeded) between."""

    num_prompts: int = 4
    input_len: int = 32
    output_len: int = 8
    batch_size: int = 256
    seed: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    input_len_min: int | None = None
    output_len_min: int | None = None

    @classmethod
    def of_lengths(cls, input_len: Length, output_len: Length, **options: Any) -> "Scenario":
        return cls(input_len=input_len.high, output_len=output_len.high, input_len_min=input_len.low,
                   output_len_min=output_len.low, **options)

    def prompt_lengths(self) -> list[int]:
        return draw_lengths(self.seed, self.num_prompts, Length(self.input_len_min or self.input_len, self.input_len),
                            "prompt")

    def output_lengths(self) -> list[int]:
        return draw_lengths(self.seed, self.num_prompts, Length(self.output_len_min or self.output_len, self.output_len),
                            "output")


@dataclass
class ModelSource:
    path: str  # what the engine loads: a local folder or a hub id
    shipped: bool  # a config shipped with fi-profile (no weights, no tokenizer)


def resolve_model(model: str) -> ModelSource:
    """A local folder, a model whose config fi-profile ships, or a hub id left to the engine."""
    if Path(model).is_dir():
        return ModelSource(str(Path(model).resolve()), shipped=False)
    shipped = resources.files("fi_profile") / "model_configs" / model / "config.json"
    if shipped.is_file():
        return ModelSource(str(Path(str(shipped)).parent), shipped=True)
    return ModelSource(model, shipped=False)


def engine_model(model: str, capture: bool) -> ModelSource:
    """What an engine about to start loads, with its processes set up to capture (the plugins
    read ``FI_PROFILE_CAPTURE``) and shipped configs kept offline."""
    from fi_profile.capture.parent_watch import mark_driver

    source = resolve_model(model)
    os.environ["FI_PROFILE_CAPTURE"] = "1" if capture else "0"
    mark_driver()  # its processes die with this one (the plugins ask the kernel, in each)
    if source.shipped:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return source


def shipped_models() -> list[str]:
    root = resources.files("fi_profile") / "model_configs"
    return sorted(f"{org.name}/{model.name}" for org in root.iterdir() if org.is_dir()
                  for model in org.iterdir() if (model / "config.json").is_file())


def model_problem(model: str) -> str | None:
    """Why the engine could not load ``model``, in one line, or None: a local folder needs a
    ``config.json``; a hub id must be in the local cache or reachable (checked by fetching its
    ``config.json``, which the engine would fetch first anyway)."""
    instead = (f"pass a local folder holding config.json (weights optional: --load-format dummy) or one of the "
               f"configs fi-profile ships: {', '.join(shipped_models())}")
    if Path(model).is_dir():
        if not (Path(model) / "config.json").is_file():
            return f"--model {model}: the folder has no config.json; {instead}"
        return None
    if resolve_model(model).shipped:
        return None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # the engine will say it itself
        return None
    import logging

    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retry warnings say nothing the one line below does not
    try:
        hf_hub_download(model, "config.json", etag_timeout=10)
    except Exception as exc:  # noqa: BLE001 - every way of not finding it ends the same
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        why = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else f"{type(exc).__name__}"
        return f"--model {model}: not a local folder, and not found on the Hugging Face hub ({why}); {instead}"
    finally:
        hub_log.setLevel(level)
    return None


def prompts_for(scenario: Scenario, vocab_size: int) -> list[list[int]]:
    """Random token ids, each prompt of its drawn length (seeded)."""
    rng = random.Random(scenario.seed)
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in scenario.prompt_lengths()]


class EngineFailed(RuntimeError):
    """The engine failed mid-run; ``summary`` merges what its processes had saved."""

    def __init__(self, message: str, summary: CaptureSummary | None, run: RunInfo) -> None:
        super().__init__(message)
        self.summary, self.run = summary, run


def run_info(engine: str, options: "CaptureOptions", attention_backend: str, status: "HookStatus") -> RunInfo:
    """The record's ``run`` block as the run starts: engine, eager or graphs, weights, dtype, TP,
    scenario, missing hooks, the layers whose kernels no hook records (kind -> layers) and those
    recorded at other shapes than their kernels ran (kind -> layers)."""
    built = options.engine
    return RunInfo(
        engine=engine,
        eager=built.eager,
        cuda_graphs_and_torch_compile=not built.eager,
        weights="dummy (random)" if built.load_format == "dummy" else built.load_format,
        dtype=built.dtype,
        tensor_parallel=built.tp,
        attention_backend=attention_backend,
        scenario=asdict(options.scenario),
        hooks_missing=sorted(status.missing),
        not_covered=dict(sorted(status.not_covered.items())),
        inexact=dict(sorted(status.inexact.items())),
        dummy_biases_zeroed=status.dummy_biases_zeroed or None,
        engine_args=dict(built.engine_args or {}),
        count_only=options.count_only,
    )


def parse_engine_args(values: list[str], owned: dict[str, str], option: str = "--engine-arg") -> dict[str, Any]:
    """``KEY=VALUE`` pairs for the engine's constructor: a value is read as JSON where it is JSON
    (``true``, ``0.5``, ``{"mode": 2}``), else kept as the string given. ``owned``: the arguments
    fi-profile sets itself (argument -> the option that sets it, or why it is fixed)."""
    parsed: dict[str, Any] = {}
    for value in values:
        key, sep, text = value.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise ValueError(f"{option} {value!r}: expected KEY=VALUE, KEY an argument name of the engine's constructor")
        if key in owned:
            raise ValueError(f"{option} {value!r}: {key} is set by fi-profile ({owned[key]})")
        try:
            parsed[key] = json.loads(text)
        except json.JSONDecodeError:
            parsed[key] = text
    return parsed


@dataclass
class HookStatus:
    """What an engine's processes report when recording starts: hook points not found, layers
    whose kernels no hook records, and layers recorded at other shapes than their kernels run
    (both kind -> layers)."""

    missing: list[str] = field(default_factory=list)
    not_covered: dict[str, int] = field(default_factory=dict)
    inexact: dict[str, int] = field(default_factory=dict)
    #: a MoE model's biases zeroed after the dummy weights were drawn (:mod:`~fi_profile.capture.dummy_routing`)
    dummy_biases_zeroed: int = 0

    @classmethod
    def of_ranks(cls, ranks: list["HookStatus"]) -> "HookStatus":
        """Every rank has the same layers (its shard of each): missing hooks joined, layers not summed."""
        merged = cls(sorted({m for r in ranks for m in r.missing}),
                     dummy_biases_zeroed=max((r.dummy_biases_zeroed for r in ranks), default=0))
        for rank in ranks:
            for found, into in ((rank.not_covered, merged.not_covered), (rank.inexact, merged.inexact)):
                for kind, layers in found.items():
                    into[kind] = max(layers, into.get(kind, 0))
        return merged


class Engine(Protocol):
    """One engine with fi-profile's hooks installed, as each engine's runner drives it."""

    framework: str  # the record's framework: "vLLM", "SGLang"
    version: str  # "vllm 0.32.0"
    attention_backend: str

    def start(self, count_only: bool, out_dir: Path, autosave_s: float) -> HookStatus: ...
    def generate(self, scenario: Scenario) -> list[list[int]]: ...
    def stop(self, out_dir: Path) -> None: ...
    def save(self, out_dir: Path) -> None: ...  # a signal stopped the capture: each process saves its whole steps
    def shutdown(self) -> None: ...


def run_capture(engine_class: Callable[..., Engine],
                options: "CaptureOptions") -> tuple[CaptureSummary | None, list[list[int]], RunInfo]:
    """Every engine's run: build ``engine_class(model, scenario, engine options, capture=...)``,
    start recording, generate, stop, merge the processes' parts; returns the merged summary, the
    generated token ids and the record's run block. If the engine dies mid-run, the parts saved
    so far are merged and :class:`EngineFailed` carries them. ``options.capture=False`` runs the
    same engine without recording (the A/B baseline)."""
    out_dir = options.out_dir
    prepare_accounting(options.min_attributed if options.kernel_accounting and options.capture else None)
    engine = engine_class(options.model, options.scenario, options.engine, capture=options.capture)
    unanswered: Optional[str] = None
    try:
        clear_output(out_dir)
        status = engine.start(options.count_only, out_dir, options.autosave_s) if options.capture else HookStatus()
        if options.capture:  # for ``fi-profile recover``, should this process be killed before it merges
            from fi_profile.capture.recovery import remember

            remember(out_dir, options.model, engine.framework, options.max_workloads,
                     run_info(engine.version, options, engine.attention_backend, status))
        log = out_dir / ENGINE_LOG
        generation_began = log_size(log)
        # a signal at any point from here (while generating, while the engine stops and writes its
        # part, while the parts merge) keeps what was recorded
        try:
            try:
                tokens, failure = engine.generate(options.scenario), None
            except Exception as exc:  # the engine died (or raised): keep what was saved
                if not options.capture:
                    raise
                tokens, failure = [], with_root_cause(said_of(exc), log, generation_began)
                keep_traceback(exc, log, generation_began)
            run = run_info(engine.version, options, engine.attention_backend, status)
            if failure is not None:
                fail_with_saved_parts(out_dir, options.model, engine.framework, options.max_workloads, run, failure)
            if not options.capture:
                return None, tokens, run
            engine.stop(out_dir)
            summary = merge_parts(out_dir, options.model, engine.framework, options.max_workloads, run)
        except Interrupted as stop:  # SIGINT / SIGTERM: keep what was saved, then shut the engine down
            if not options.capture:
                raise
            run = run_info(engine.version, options, engine.attention_backend, status)
            # an engine stopping when the signal came answers this save after its stop, which has
            # written its part by then (its processes take one call at a time)
            stop.unanswered = saved_in_time(engine, out_dir)
            stop.summary = interrupted_record(out_dir, options.model, engine.framework, options.max_workloads, run,
                                              stop.name, stop.unanswered)
            unanswered = stop.unanswered
            raise
        assert summary.record.run is not None
        return summary, tokens, summary.record.run
    finally:
        if unanswered is None:
            engine.shutdown()
        else:  # its shutdown would talk to processes that did not answer (SGLang's zmq then aborts)
            kill_engine_processes()


#: how long the engine's processes have to save their steps after a signal, before the record is
#: made from their last saved parts
SAVE_AT_SIGNAL_S = 30.0


def saved_in_time(engine: Engine, out_dir: Path, timeout_s: float = SAVE_AT_SIGNAL_S) -> Optional[str]:
    """A signal stopped the capture: ask every engine process to save the whole steps it has
    (:meth:`Engine.save`), waiting at most ``timeout_s``. Returns None once they did, else why not
    (the engine is gone, or busy past the wait: their last parts stand)."""
    outcome: list[Optional[str]] = []

    def save() -> None:
        try:
            engine.save(out_dir)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - the parts saved before stand
            outcome.append(f"{type(exc).__name__}: {exc}"[:200])

    saver = threading.Thread(target=save, name="fi-profile-save", daemon=True)
    saver.start()
    saver.join(timeout_s)
    return outcome[0] if outcome else f"the engine did not save within {timeout_s:g} s"


def interrupted_record(out_dir: Path, model: str, framework: str, max_workloads: int, run: RunInfo,
                       signal_name: str, not_saved: Optional[str] = None) -> CaptureSummary | None:
    """A signal stopped the capture: the record from what its processes saved (None: nothing saved
    yet); ``not_saved``: why they could not save at the signal (then their last parts stand)."""
    parts = sorted((out_dir / PARTS_DIR).glob("*.json"))
    if not parts:
        return None
    # a process that saved at the stop says so in its part (through the RPC or at its own exit,
    # when the signal reached it too); an RPC that did not answer is then no loss
    if all(json.loads(part.read_text()).get("stopped") for part in parts):
        held = "the steps each engine process had finished at the signal (the one in flight left out)"
    else:
        held = f"the steps saved before (at most one --save-every interval lost{f': {not_saved}' if not_saved else ''})"
    return merge_parts(out_dir, model, framework, max_workloads, run, f"interrupted by {signal_name}; the record holds "
                       f"{held}")


def fail_with_saved_parts(out_dir: Path, model: str, framework: str, max_workloads: int, run: RunInfo, failure: str) -> None:
    """The engine died mid-run: merge what its processes saved and raise :class:`EngineFailed`."""
    died = f"engine failed mid-run ({failure[:500]}); the record holds the steps saved before"
    if any((out_dir / PARTS_DIR).glob("*.json")):
        summary = merge_parts(out_dir, model, framework, max_workloads, run, died)
        assert summary.record.run is not None
        raise EngineFailed(failure, summary, summary.record.run)
    raise EngineFailed(failure, None, judged(run, died))


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
