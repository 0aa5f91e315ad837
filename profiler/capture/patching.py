"""Engine-independent wrapping of engine methods: record, NVTX range, never interfere.

A wrapper does nothing but call through while capture is off. While it is on, it turns the call's
arguments into kernel calls (the hook point's ``to_calls``), records them, wraps the real call in an
NVTX range named after the Definition (when an NVTX tool listens), and returns the real result
unchanged. A ``to_calls`` that
raises is counted in the recorder's errors; the engine's call still runs. Calls nested inside an
already-hooked call of the same op (``forward_cpu`` -> ``forward_native``) are not counted twice.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from torch._dynamo.comptime import comptime

from fi_profile.capture import traced as traced_calls
from fi_profile.capture.arguments import SignatureMismatch, argument_reader
from fi_profile.capture.graph_capture import (
    CAPTURING,
    captured_call_ends,
    observe_captured,
    observe_captured_prologue,
    spanning,
)
from fi_profile.capture.kernel_accounting import ACCOUNTING, JOIN, call_range, feeds_range, graph_range
from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.recorder import RECORDER


def _nvtx_functions() -> tuple[Optional[Callable[[str], Any]], Optional[Callable[[], Any]]]:
    """NVTX push/pop when a tool listens (Nsight Systems / Compute set ``NVTX_INJECTION64_PATH``),
    or when ``FI_PROFILE_NVTX=1``; ``FI_PROFILE_NVTX=0`` turns them off. Without a tool NVTX ranges
    go nowhere, and the Python calls would still cost about a microsecond per hooked call."""
    wanted = os.environ.get("FI_PROFILE_NVTX")
    if wanted == "0" or (wanted != "1" and not os.environ.get("NVTX_INJECTION64_PATH")):
        return None, None
    try:
        import nvtx
    except ImportError:  # pragma: no cover - nvtx is a dependency, but hooks must not need it
        return None, None
    return nvtx.push_range, nvtx.pop_range


_push, _pop = _nvtx_functions()

try:
    from torch.compiler import is_compiling as _is_compiling
except ImportError:  # pragma: no cover
    def _is_compiling() -> bool:
        return False


ToCalls = Callable[..., Sequence[Optional[KernelCall]]]
_depth = threading.local()
_NO_SPAN = contextlib.nullcontext()


@dataclass(frozen=True)
class HookPoint:
    """``module.cls.method`` is turned into kernel calls by ``to_calls``, which takes the
    method's arguments it needs under the method's own parameter names (``self`` included)."""

    module: str
    cls: str
    methods: tuple[str, ...]
    op: str
    to_calls: ToCalls
    #: only needed with some backends: not reported missing when its module does not import
    optional: bool = False
    #: a step boundary (``to_calls`` reports the step's signature to the recorder), not a kernel
    boundary: bool = False
    #: its var axes change between steps of one signature (attention: the KV pages), so it is
    #: recorded in every step, replayed ones too (but for count-only capture: its ids do not change)
    live: bool = False
    #: ops that run inside this one as part of it (a MoE layer's experts on some backends run
    #: their activation through the hooked SiluAndMul): not counted on their own while it runs
    nested: tuple[str, ...] = ()
    #: what the hook records while torch.compile traces it, when not ``to_calls`` (a live op:
    #: a callable that builds each step's calls from the engine's per-step metadata)
    traced: Optional[ToCalls] = None
    #: ``to_calls`` takes the method's arguments as passed (``*args, **kwargs``), not by name
    raw: bool = False
    #: not a kernel: ``to_calls`` gives a context manager that the method runs in, recording or
    #: not (an engine phase the hooks must know of, such as capturing a CUDA graph, or an engine step)
    around: bool = False
    #: runs outside the model's forward (vLLM's lm_head, sampling): its call alone does not show
    #: that a step's forward was seen (:meth:`~fi_profile.capture.recorder.Recorder.engine_step`)
    outside_forward: bool = False
    #: not recorded: the engine prepares the inputs of its op's next call here, outside that call's
    #: hooked method (SGLang's MLA key concatenation before its ragged prefill); its kernels are
    #: accounted to the Definitions ``to_calls`` names (the next call's own hook records them)
    prologue: bool = False
    #: where it records nothing itself, the op of the next call whose kernels its own are, in a CUDA
    #: graph (SGLang's ``TopK`` before its experts: the routing is part of the MoE Definition)
    feeds: str = ""
    #: in a traced forward, its template goes before its last inner call of this op, not after
    #: them all: the order its kernels run in (a recurrent layer's core op runs before its gated
    #: norm, an inner call hooked on its own; a gated attention's output gate before its output
    #: projection's GEMM)
    traced_before: str = ""
    #: an ``around`` hook on a layer's method whose own kernels (its splits and copies between its
    #: inner hooked calls) are its inner call's of this op: the layer's core op (SGLang's Gated
    #: DeltaNet layer, whose recurrence is hooked on its inner ``RadixLinearAttention``)
    span: str = ""


def observe(op: str, make_calls: Callable[[], Sequence[Optional[KernelCall]]], live: bool = False,
            where: str = "eager", times: int = 1) -> str:
    """One hooked invocation of ``op`` (``times``: that many of the same, such as a compiled
    step's layers of one shape): recorded in a step being learned (or live), only counted in a
    replayed step; returns its NVTX label. ``make_calls`` raising is counted as lost, never passed
    on. ``where`` the calls ran: ``eager``, or ``compiled`` (from a trace template). The label is
    empty where the invocation recorded nothing of its own (:meth:`~fi_profile.capture.recorder.Recorder.record`)."""
    replay = RECORDER.replay
    learned = not (live and not RECORDER.count_only)  # part of the learned step, or recorded live
    if replay is not None and learned:  # a known step: count only (the hot path, a few operations)
        return replay.count(op, times)
    try:
        return RECORDER.record(make_calls(), op, learned, where, times)
    except Exception as exc:  # a hook must never break the engine
        return RECORDER.lost(op, exc, learned, times)  # counted, and the step's invocation count kept right


def wrap(fn: Callable[..., Any], op: str, to_calls: ToCalls, live: bool = False, nested: tuple[str, ...] = (),
         cls: Optional[type] = None, traced: Optional[ToCalls] = None, outside_forward: bool = False,
         feeds: str = "", traced_before: str = "") -> Callable[..., Any]:
    """``fn`` hooked: ``to_calls`` gets the arguments it names, read by name from ``fn``'s
    signature (or, for a dispatcher on ``cls``, from the method it dispatches to). While
    torch.compile traces ``fn``, ``traced`` (default ``to_calls``) records a template instead
    (:mod:`fi_profile.capture.traced`); nothing is added to the traced graph. A call, unless
    ``outside_forward``, shows that the step's model forward ran where the hooks see it; one that
    records nothing in a CUDA graph being captured gives its nodes to the next call of op ``feeds``;
    traced, its template goes before its last inner call of op ``traced_before``, where one is given."""
    read = argument_reader(fn, to_calls, cls)
    in_forward = not outside_forward
    trace_calls = traced or to_calls
    trace_read = read if traced is None else argument_reader(fn, traced, cls)

    def at_trace(ctx: Any) -> None:
        traced_calls.at_trace(ctx, op, trace_calls, trace_read, traced_before)

    @functools.wraps(fn)
    def hooked(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():  # Dynamo traces this: a template, recorded while it traces, after the
            comptime(traced_calls.at_entry)
            result = fn(*args, **kwargs)  # call (its inputs are graph inputs by then: their order kept)
            comptime(at_trace)
            return result
        capturing = CAPTURING.trace is not None  # the engine captures a CUDA graph: a template
        if not (RECORDER.active or capturing) or getattr(_depth, op, 0):
            return fn(*args, **kwargs)
        made = None
        if capturing:
            made = observe_captured(op, lambda: trace_calls(**trace_read(args, kwargs)), feeds)
            label = op
        else:
            if in_forward:
                RECORDER.forward_seen = True
            label = observe(op, lambda: to_calls(**read(args, kwargs)), live)
        # the real call inside an NVTX range, marked so nested calls of the same op are not counted
        outer = [getattr(_depth, m, 0) for m in nested] if nested else ()
        setattr(_depth, op, 1)
        for m in nested:
            setattr(_depth, m, 1)
        if _push is not None:
            _push(label or op)
        accounted = None
        if ACCOUNTING.active:
            # a call recording nothing whose kernels are the next call's of a family: that call's range
            accounted = call_range(label) if label else feeds_range(feeds) if feeds and not capturing else None
        if accounted is not None:
            accounted.__enter__()
        try:
            return fn(*args, **kwargs)
        finally:
            if made is not None:
                captured_call_ends(made)
            if accounted is not None:
                accounted.__exit__(None, None, None)
            if _pop is not None:
                _pop()
            setattr(_depth, op, 0)
            for m, was in zip(nested, outer):
                setattr(_depth, m, was)

    hooked.__fi_profile_original__ = fn  # type: ignore[attr-defined]
    return hooked


def wrap_prologue(fn: Callable[..., Any], op: str, to_calls: ToCalls, cls: Optional[type] = None) -> Callable[..., Any]:
    """``fn`` computes inputs of the calls ``to_calls`` names (recording nothing: the calls it
    prepares record them), so its kernels are theirs: while the engine's kernels are accounted for
    it runs in those Definitions' range, and while a CUDA graph is captured its nodes are theirs
    (:func:`~fi_profile.capture.graph_capture.observe_captured_prologue`). Neither where it names
    none or raises (the calls' own hooks say why)."""
    read = argument_reader(fn, to_calls, cls)

    @functools.wraps(fn)
    def hooked(*args: Any, **kwargs: Any) -> Any:
        capturing = CAPTURING.trace is not None
        if _is_compiling() or not (capturing or (ACCOUNTING.active and RECORDER.active)):
            return fn(*args, **kwargs)
        try:
            names = tuple(dict.fromkeys(c.definition.name for c in to_calls(**read(args, kwargs)) if c is not None))
        except Exception:  # noqa: BLE001 - a hook must never break the engine
            names = ()
        if not names:
            return fn(*args, **kwargs)
        if capturing:
            made = observe_captured_prologue(op, names)
            try:
                return fn(*args, **kwargs)
            finally:
                captured_call_ends(made)
        with call_range(JOIN.join(names)):
            return fn(*args, **kwargs)

    hooked.__fi_profile_original__ = fn  # type: ignore[attr-defined]
    return hooked


def wrap_boundary(
    fn: Callable[..., Any], op: str, on_boundary: Callable[..., Any], cls: Optional[type] = None, raw: bool = False
) -> Callable[..., Any]:
    """``fn`` with ``on_boundary`` called first while recording (a step boundary, or another
    per-step event): with its arguments by name, or ``raw`` as passed. A boundary that counts a
    graph run (:func:`fi_profile.capture.graph_runs.count_graph_run`) while the engine's kernels
    are accounted for has ``fn`` run inside that graph's range."""
    read = None if raw else argument_reader(fn, on_boundary, cls)

    @functools.wraps(fn)
    def hooked(*args: Any, **kwargs: Any) -> Any:
        if RECORDER.active and not _is_compiling():
            try:
                if read is None:
                    on_boundary(*args, **kwargs)
                else:
                    on_boundary(**read(args, kwargs))
            except Exception as exc:  # a hook must never break the engine
                RECORDER.error(op, exc)
            graph = ACCOUNTING.pending_graph
            if graph is not None:
                ACCOUNTING.pending_graph = None
                with graph_range(graph):
                    return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    hooked.__fi_profile_original__ = fn  # type: ignore[attr-defined]
    return hooked


def span_only() -> Any:
    """The context of an ``around`` hook point that is only a span (:attr:`HookPoint.span`): none."""
    return _NO_SPAN


def wrap_around(fn: Callable[..., Any], op: str, context: Callable[..., Any], cls: Optional[type] = None,
                traced: Optional[ToCalls] = None, span: str = "", traced_before: str = "") -> Callable[..., Any]:
    """``fn`` run inside the context manager that ``context`` makes from its arguments (by name);
    a ``context`` that raises is counted, and ``fn`` runs without it. While Dynamo traces ``fn``
    the context is not made (it is Python that runs eagerly); ``traced``, where given, records the
    calls the compiled ``fn`` runs past it as a template, after ``fn``'s inner calls (before its
    last inner call of op ``traced_before``, where given). ``span``: the
    op of ``fn``'s inner call whose kernels ``fn``'s own are (:attr:`HookPoint.span`,
    :func:`~fi_profile.capture.graph_capture.spanning`)."""
    read = argument_reader(fn, context, cls)
    trace_read = None if traced is None else argument_reader(fn, traced, cls)

    def at_trace(ctx: Any) -> None:
        traced_calls.at_trace(ctx, op, traced, trace_read, traced_before)

    @functools.wraps(fn)
    def hooked(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            if traced is not None:
                comptime(traced_calls.at_entry)
            result = fn(*args, **kwargs)
            if traced is not None:
                comptime(at_trace)
            return result
        with spanning(span) if span else _NO_SPAN:
            try:
                manager = context(**read(args, kwargs))
            except Exception as exc:  # a hook must never break the engine
                RECORDER.error(op, exc)
                return fn(*args, **kwargs)
            with manager:
                return fn(*args, **kwargs)

    hooked.__fi_profile_original__ = fn  # type: ignore[attr-defined]
    return hooked


def _install_functions(module: Any, point: HookPoint, installed: list[str], missing: list[str]) -> bool:
    """``point.methods`` as functions of ``module`` (``point.cls`` empty): each replaced in the
    module, where the engine's code looks it up when it calls it. A function whose signature cannot
    be read (a registered torch op) is read by keyword only."""
    found = False
    for name in point.methods:
        raw = getattr(module, name, None)
        if raw is None:
            continue
        found = True
        if getattr(raw, "__fi_profile_original__", None) is not None:
            continue
        try:
            hooked = wrap_around(raw, point.op, point.to_calls, None, point.traced, point.span,
                                  point.traced_before) if point.around else wrap(
                raw, point.op, point.to_calls, point.live, point.nested, None, point.traced, point.outside_forward,
                point.feeds, point.traced_before)
        except SignatureMismatch as exc:
            missing.append(f"{point.module}.{name}: {exc}"[:300])
            continue
        setattr(module, name, hooked)
        installed.append(f"{point.module}.{name}")
    return found


#: hook ops left out on purpose (comma-separated, e.g. ``rope``): their points are reported missing,
#: so the record says its calls are not in it (to see what the engine runs that no hook records)
SKIP_ENV = "FI_PROFILE_SKIP_HOOKS"


def install(points: Sequence[HookPoint]) -> tuple[list[str], list[str]]:
    """Patch every hook point that exists; returns (installed, missing) as readable names."""
    installed: list[str] = []
    missing: list[str] = []
    skipped = {op.strip() for op in os.environ.get(SKIP_ENV, "").split(",") if op.strip()}
    for point in points:
        if point.op in skipped:
            missing.append(f"{point.module}.{point.cls or ''}.{'/'.join(point.methods)} (left out: {SKIP_ENV})")
            continue
        try:
            module = importlib.import_module(point.module)
            cls = getattr(module, point.cls) if point.cls else None
        except Exception as exc:  # an engine module may fail to import for reasons of its own
            if not point.optional:
                missing.append(f"{point.module}.{point.cls} ({type(exc).__name__}: {exc})"[:300])
            continue
        if cls is None:  # module-level kernel functions, looked up in the module at each call
            found_functions = _install_functions(module, point, installed, missing)
            if not found_functions and not point.optional:
                missing.append(f"{point.module}: none of {point.methods}")
            continue
        found = False
        for method in point.methods:
            raw = cls.__dict__.get(method)
            if raw is None and method == "forward":
                raw = getattr(cls, method, None)  # inherited forward (CustomOp): patch on this class
            if raw is None:
                continue
            if isinstance(raw, staticmethod):
                missing.append(f"{point.cls}.{method} (static, not supported)")
                continue
            if getattr(raw, "__fi_profile_original__", None) is not None:
                found = True
                continue
            try:
                if point.around:
                    hooked = wrap_around(raw, point.op, point.to_calls, cls, point.traced, point.span, point.traced_before)
                elif point.prologue:
                    hooked = wrap_prologue(raw, point.op, point.to_calls, cls)
                elif point.boundary:
                    hooked = wrap_boundary(raw, point.op, point.to_calls, cls, point.raw)
                else:
                    hooked = wrap(raw, point.op, point.to_calls, point.live, point.nested, cls, point.traced,
                                  point.outside_forward, point.feeds, point.traced_before)
            except SignatureMismatch as exc:  # the engine's method changed: not hooked, and said so
                missing.append(f"{point.cls}.{method}: {exc}"[:300])
                found = True
                continue
            setattr(cls, method, hooked)
            installed.append(f"{point.cls}.{method}")
            found = True
        if not found:
            missing.append(f"{point.module}.{point.cls}: none of {point.methods}")
    return installed, missing
