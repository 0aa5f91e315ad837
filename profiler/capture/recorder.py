"""Per-process recorder of kernel calls, kept cheap on the hot path.

Every hook hands its calls to the process's :data:`RECORDER`. Recording costs a dict increment
per call; index tensors are copied only the first time a (definition, axes) pair is seen.

Steps repeat: an engine step's calls are a function of its shape (token counts and attention
layout), which the engine's hooks report at each step boundary as a signature. The first step of a
signature is recorded call by call and its call list learned; a later step with the same
signature is replayed: each hook then only counts (and opens its NVTX range), and the learned
list is added at the step's end. Live hooks (attention, whose KV pages are not in the signature)
are recorded in every step and are not part of the learned list. A replayed step whose
hooked-call count differs from the learned one is reported in ``errors``. Without step
boundaries every call is recorded in full. Nothing is recorded until the driver starts the model
phase, so engine start-up (memory profiling, warm-up, graph capture) stays out of the record.
``flush`` writes this process's part file atomically; ``fi_profile.capture.output`` merges the
parts of all processes. With ``autosave`` the part is also rewritten at a step boundary every few
seconds, so an engine process that dies leaves its record up to its last whole saved step.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Hashable, Iterable, Iterator, Mapping, Optional

import torch
from safetensors.torch import save_file

from fi_profile.capture.kernel_accounting import ACCOUNTING, JOIN, wanted
from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.learned_steps import LearnedStep, StepLearning, StepReplay, WorkloadKey
from fi_profile.schema.definition import Definition

#: per-process parts and their tensors, hidden so the output folder holds only documents
PARTS_DIR = ".fi-profile/parts"
#: per-process progress (steps, tokens, calls) for the driver's progress line
PROGRESS_DIR = ".fi-profile/progress"


class Recorder:
    def __init__(self) -> None:
        self.active = False
        self.count_only = False  # count calls per Definition, keep no workloads
        self.page_size: Optional[int] = None
        self.num_pages: Optional[int] = None
        #: (output folder, seconds between saves) while parts are saved during the run
        self.autosave: Optional[tuple[Path, float]] = None
        #: where this process reports steps, tokens and calls for the driver's progress line
        self.progress_file: Optional[Path] = None
        #: whether the current engine step's model forward was seen: a hooked call inside it, or a
        #: run of a compiled forward or CUDA graph (set by the hooks: a plain store, as it is on the
        #: hot path of every hooked call; read by :meth:`engine_step`)
        self.forward_seen = False
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.calls: Counter[str] = Counter()
        self.workloads: Counter[WorkloadKey] = Counter()
        self.definitions: dict[str, Definition] = {}
        self.samples: dict[WorkloadKey, KernelCall] = {}
        self.errors: Counter[str] = Counter()
        #: per op: hooked invocations whose calls are unknown (their hook failed), replayed steps included
        self.lost_calls: Counter[str] = Counter()
        #: the op each recorded Definition came from (which counts a lost invocation may lower)
        self.ops: dict[str, str] = {}
        #: how each Definition's calls ran: "eager" (its own call), "compiled" (traced into a
        #: torch.compile graph), "cuda_graph" (its own kernel, replayed from a CUDA graph)
        self.execution: dict[str, set[str]] = {}
        #: compiled-forward and CUDA-graph runs by how they ran (compiled, piecewise_cuda_graph, full_cuda_graph)
        self.graph_runs: Counter[str] = Counter()
        #: compiled-forward runs by (tokens the compiled code ran with, tokens the step scheduled)
        self.padding: Counter[tuple[int, int]] = Counter()
        #: learned steps by signature
        self.steps: dict[Hashable, LearnedStep] = {}
        self.step_stats: Counter[str] = Counter()
        #: the steps in order, run-length encoded: [tokens, requests, decoding, prefilling, steps]
        self.schedule: list[list[int]] = []
        #: engine steps that ran the model's forward (learned + replayed steps, unless a step ran
        #: without the attention metadata boundary, whose calls are then recorded one by one)
        self.engine_steps = 0
        #: layers the model has whose hook never saw a call (set at stop: kind -> layers)
        self.unseen_layers: dict[str, int] = {}
        #: the engine's kernel time attributed to Definitions (set at stop, when accounted for:
        #: :mod:`fi_profile.capture.kernel_accounting`)
        self.engine_kernels: Optional[dict] = None
        #: the current step, while it replays a learned one (its hooked invocations only counted)
        self.replay: Optional[StepReplay] = None
        #: the current step, while it is learned
        self._learning: Optional[StepLearning] = None
        self._signature: Hashable = None
        self._next_save = time.monotonic() + (self.autosave[1] if self.autosave else 0.0)
        self._saved_samples = 0  # samples already in the blob on disk (samples only grow)
        self.tokens = 0  # tokens of the steps committed so far
        self._step_tokens = 0
        self._next_progress = 0.0

    @property
    def step_tokens(self) -> int:
        """The query tokens of the current step (as its boundary reported them)."""
        return self._step_tokens

    def begin_step(self, signature: Hashable, tokens: int = 0) -> None:
        """A step boundary: end the current step and start one of ``signature`` (``tokens``: the
        tokens it runs, for the progress line)."""
        snapshot = None
        with self._lock:
            nothing_yet = (self.replay is not None and self.replay.replayed == 0) or (
                self._learning is not None and self._learning.empty
            )
            if nothing_yet:  # a second boundary before any call (several KV-cache groups): same step
                signature = (self._signature, signature)
            else:
                self._commit_step()
                self._schedule(signature)
                if self.autosave is not None and time.monotonic() >= self._next_save:
                    snapshot = self._snapshot()  # whole steps only: the last one just ended
            self._signature = signature
            self._step_tokens = tokens
            learned = self.steps.get(signature)
            if learned is None:
                self.replay, self._learning = None, StepLearning()
            else:
                self.replay, self._learning = StepReplay(learned), None
        if snapshot is not None:
            directory, interval = self.autosave
            self._write(directory, *snapshot)
            self._next_save = time.monotonic() + interval
        if self.progress_file is not None and time.monotonic() >= self._next_progress:
            self.report_progress()
            self._next_progress = time.monotonic() + 0.5

    def _schedule(self, signature: Hashable) -> None:
        """The step's shape (:func:`fi_profile.capture.paged_layout.step_shape`) appended to the schedule."""
        if not (isinstance(signature, tuple) and len(signature) == 4 and all(isinstance(v, int) for v in signature)):
            return
        if self.schedule and tuple(self.schedule[-1][:4]) == signature:
            self.schedule[-1][4] += 1
        else:
            self.schedule.append([*signature, 1])

    def report_progress(self) -> None:
        """Steps, tokens and calls so far, for the driver's progress line (a tiny file, replaced)."""
        if self.progress_file is None:
            return
        steps = max(sum(self.step_stats.values()), self.engine_steps)
        progress = {"steps": steps, "tokens": self.tokens, "calls": sum(self.calls.values())}
        tmp = self.progress_file.with_suffix(".tmp")
        try:
            self.progress_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(progress))
            os.replace(tmp, self.progress_file)
        except OSError:  # progress is a nicety: never a reason to fail
            pass

    def _commit_step(self) -> None:
        if self.replay is not None:
            step = self.replay.step
            if not self.replay.matches:
                self.errors[
                    f"step replay: {self.replay.replayed} hooked calls where the learned step had {len(step.labels)}; "
                    "counted as learned"
                ] += 1
            self.calls.update(step.calls)  # the learned step's calls, summed once when learned
            if not self.count_only:
                self.workloads.update(step.workloads)
            for op, lost in step.lost:  # a hook that failed while the step was learned
                self.lost_calls[op] += lost
            self.step_stats["replayed"] += 1
            self.tokens += self._step_tokens
        elif self._learning is not None:
            self.steps[self._signature] = self._learning.learned()
            self.step_stats["learned"] += 1
            self.tokens += self._step_tokens
        self._step_tokens = 0
        self.replay, self._learning, self._signature = None, None, None

    def record(self, calls: Iterable[Optional[KernelCall]], op: str, learned: bool = True, where: str = "eager",
               times: int = 1, empty_label: str = "") -> str:
        """Record one hooked invocation's calls; returns its label (its Definitions, joined by
        :data:`~fi_profile.capture.kernel_accounting.JOIN`; ``empty_label`` when it has none): the
        name of its range in the engine kernel accounting. An invocation that records nothing of
        its own (a MoE's shared expert, which its MoE call records) opens no range there: its
        kernels are the enclosing range's.
        ``learned=False``: a live invocation, recorded in every step, not part of the step's list.
        ``where``: how the calls ran (``eager``, ``compiled`` or ``cuda_graph``: see ``execution``).
        ``times``: the same invocation that many times (layers of one shape in a compiled step)."""
        names: list[str] = []
        with self._lock:
            for call in calls:
                if call is None:
                    continue
                name = call.definition.name
                if name not in names:
                    names.append(name)
                self.calls[name] += times
                if name not in self.definitions:
                    self.definitions[name] = call.definition
                    self.ops[name] = op
                self.execution.setdefault(name, set()).add(where)
                key = (name, tuple(call.axes.items()))  # op functions build axes in a fixed order
                if self._learning is not None and learned:
                    self._learning.keys.extend([key] * times)
                if self.count_only:
                    continue
                self.workloads[key] += times
                if key not in self.samples:
                    # (a tensor, or a callable that makes it: page ids are gathered only for kept samples)
                    call.tensors = {k: _host_copy(v() if callable(v) else v) for k, v in call.tensors.items()}
                    self.samples[key] = call
            label = JOIN.join(names) if names else empty_label
            if self._learning is not None and learned:
                self._learning.labels.extend([label] * times)
        return label

    def graph_run(self, mode: str, ran_with: int, scheduled: int) -> None:
        """A compiled forward ran (``mode``: compiled, piecewise_cuda_graph, full_cuda_graph) with
        ``ran_with`` tokens (padded for a CUDA graph) for ``scheduled`` tokens of the step."""
        with self._lock:
            self.graph_runs[mode] += 1
            self.padding[(ran_with, scheduled)] += 1

    @contextlib.contextmanager
    def engine_step(self, description: str) -> Iterator[None]:
        """One engine step that runs the model's forward (``description``: its shape, for the
        error). Every such step must have its forward in the record, recorded or replayed from a
        learned step or a graph: a step whose forward no hook saw is a hook error naming it."""
        self.forward_seen = False
        yield
        self.engine_steps += 1
        if self.active and not self.forward_seen:
            self.error("step", RuntimeError(
                f"{description} ran a model forward in which no hooked call and no compiled-forward or CUDA-graph run "
                "was seen: its calls are not in the record"))

    def error(self, where: str, exc: BaseException, times: int = 1) -> None:
        with self._lock:
            self.errors[f"{where}: {type(exc).__name__}: {exc}"[:300]] += times

    def lost(self, op: str, exc: BaseException, learned: bool = True, times: int = 1) -> str:
        """A hooked invocation of ``op`` (``times`` of them) whose calls are unknown (its hook
        raised ``exc``): counted as an error and as lost, in this step and in every later step
        that replays it."""
        self.error(op, exc, times)
        with self._lock:
            self.lost_calls[op] += times
            if self._learning is not None and learned:
                self._learning.lost[op] += times
        # keeps the step's invocation count right; its range names no Definition: its kernels are nobody's
        return self.record((), op, learned, times=times, empty_label=op)

    def flush(self, directory: Path, stopped: bool = False) -> Path:
        """End the current step and write this process's part atomically; returns the part file.
        ``stopped``: the recording has ended, and the part holds all of it."""
        with self._lock:
            self._commit_step()
            snapshot = self._snapshot(stopped)
        self.report_progress()
        return self._write(Path(directory), *snapshot)

    def save_whole_steps(self, directory: Path) -> Optional[Path]:
        """A capture stopped by a signal: stop recording and write this process's part with the
        steps it has committed (the step in flight, if any, is left out: whole steps only); None
        where it was not recording (nothing new since its last part)."""
        with self._lock:
            if not self.active:
                return None
            self.active, self.autosave = False, None
            snapshot = self._snapshot(stopped=True)
        return self._write(Path(directory), *snapshot)

    def _snapshot(self, stopped: bool = False) -> tuple[dict, dict[str, torch.Tensor]]:
        """The part document and, when samples were added since the last save, the blob tensors;
        ``stopped``: the part holds every step this process recorded (the merge says so).

        Blob keys are the samples' insertion order, which never changes until a reset: the blob
        is rewritten only when samples were added, always before the JSON that names its keys,
        so a part file on disk never names a tensor its blob lacks. Called under the lock."""
        if torch.cuda.is_initialized():  # samples copied to the host asynchronously have landed
            torch.cuda.synchronize()
        sample_ids = {key: i for i, key in enumerate(self.samples)}
        blob_tensors: dict[str, torch.Tensor] = {}
        if len(self.samples) > self._saved_samples:
            for i, sample in enumerate(self.samples.values()):
                for tname, tensor in sample.tensors.items():
                    blob_tensors[f"s{i}.{tname}"] = tensor.contiguous()
        workloads = []
        for key, count in self.workloads.items():
            sample = self.samples[key]
            workloads.append(
                {
                    "definition": key[0],
                    "axes": dict(key[1]),
                    "count": count,
                    "tensors": {t: f"s{sample_ids[key]}.{t}" for t in sample.tensors},
                    "scalars": sample.scalars,
                }
            )
        part = {
            "pid": os.getpid(),
            "calls": dict(self.calls),
            "workloads": workloads,
            "definitions": {n: d.to_dict() for n, d in self.definitions.items()},
            "blob": f"{PARTS_DIR}/{os.getpid()}.safetensors" if any(w["tensors"] for w in workloads) else None,
            "errors": dict(self.errors),
            "lost_calls": dict(self.lost_calls),
            "ops": dict(self.ops),
            "execution": {n: sorted(w) for n, w in self.execution.items()},
            "graph_runs": dict(self.graph_runs),
            "padding": [[padded, real, n] for (padded, real), n in self.padding.items()],
            "steps": dict(self.step_stats),
            "engine_steps": self.engine_steps,
            "unseen_layers": self.unseen_layers,
            "schedule": self.schedule,
            "engine_kernels": self.engine_kernels,
            "stopped": stopped,
        }
        self._saved_samples = len(self.samples)
        return part, blob_tensors

    @staticmethod
    def _write(directory: Path, part: dict, blob_tensors: dict[str, torch.Tensor]) -> Path:
        parts = directory / PARTS_DIR
        parts.mkdir(parents=True, exist_ok=True)
        if blob_tensors:
            blob = directory / part["blob"]
            save_file(blob_tensors, f"{blob}.tmp")
            os.replace(f"{blob}.tmp", blob)
        path = parts / f"{part['pid']}.json"
        tmp = parts / f"{part['pid']}.json.tmp"
        tmp.write_text(json.dumps(part))
        os.replace(tmp, path)
        return path


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy that does not wait for the device: pinned memory, non-blocking (the recorder
    synchronizes before it writes a part)."""
    if tensor.device.type != "cuda":
        return tensor.detach().clone()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor.detach(), non_blocking=True)
    return host


RECORDER = Recorder()


def start_recording(*, count_only: bool, out_dir: Optional[str], autosave_s: float, page_size: int, num_pages: int) -> None:
    """Start this process's model phase (every engine's worker-side start): reset, then record;
    with ``out_dir`` the part is saved every ``autosave_s`` seconds and progress is reported."""
    RECORDER.autosave = (Path(out_dir), autosave_s) if out_dir is not None else None
    global _EXIT_DIR
    if out_dir is not None:  # an engine process stopped by a signal (Ctrl-C reaches them all) keeps its steps
        if _EXIT_DIR is None:
            atexit.register(_save_at_exit)
            _exit_at_sigterm()
        _EXIT_DIR = Path(out_dir)
    RECORDER.progress_file = Path(out_dir) / PROGRESS_DIR / f"{os.getpid()}.json" if out_dir is not None else None
    RECORDER.reset()
    RECORDER.count_only = count_only
    RECORDER.page_size = page_size
    RECORDER.num_pages = num_pages
    RECORDER.active = True
    if wanted():  # the engine's kernels accounted for, from here to the stop
        try:
            ACCOUNTING.start()
        except Exception as exc:  # noqa: BLE001 - another profiler holds it, say: the record says so
            RECORDER.error("kernel accounting", RuntimeError(
                f"the engine's kernels are not measured: torch.profiler did not start ({type(exc).__name__}: {exc})"))


#: where this process saves its part at exit, while it still records (set by :func:`start_recording`)
_EXIT_DIR: Optional[Path] = None


def _exit_at_sigterm() -> None:
    """An engine process that would die at once at SIGTERM (its default: a process group signalled,
    as ``timeout`` and batch schedulers do, reaches the engine's processes too) exits instead, so
    that :func:`_save_at_exit` keeps its steps. The exit unwinds the engine's code first (the
    recorder's lock released: nothing is saved from inside the handler). A handler of the engine's
    own (vLLM's EngineCore raises SystemExit) is left as it is; so is a process that is not its
    main thread's."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def exit_now(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one kills as before
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_now)


def _save_at_exit() -> None:
    """At this process's exit while it still records (the capture was stopped before its end):
    save its whole steps (:meth:`Recorder.save_whole_steps`); never an error at exit."""
    try:
        if _EXIT_DIR is not None:
            RECORDER.save_whole_steps(_EXIT_DIR)
    except Exception:  # noqa: BLE001 - exiting: its last autosaved part stands
        pass


def save_whole_steps(out_dir: str) -> Optional[str]:
    """Every engine's worker-side save at a signal (:meth:`Recorder.save_whole_steps`)."""
    part = RECORDER.save_whole_steps(Path(out_dir))
    return None if part is None else str(part)


def stop_recording(out_dir: str, unseen_layers: Optional[dict[str, int]] = None,
                   kernel_naming: Optional[Mapping[str, Any]] = None) -> Path:
    """Stop recording and write this process's part; returns the part file. ``unseen_layers``: the
    model's covered layers whose hook never saw a call, by kind (``run.not_covered``);
    ``kernel_naming``: what the kernel accounting reads of the families' kernel names
    (:data:`fi_profile.families.KERNEL_NAMING`)."""
    RECORDER.active = False
    RECORDER.unseen_layers = dict(unseen_layers or {})
    try:
        op_types = {name: d.op_type for name, d in RECORDER.definitions.items()}
        accounted = ACCOUNTING.stop(op_types, RECORDER.engine_steps, **(kernel_naming or {}))
        RECORDER.engine_kernels = accounted.part() if accounted is not None else None
    except Exception as exc:  # noqa: BLE001 - the accounting must never cost the record
        RECORDER.error("kernel accounting", exc)
    RECORDER.autosave = None
    part = RECORDER.flush(Path(out_dir), stopped=True)
    RECORDER.progress_file = None
    return part
