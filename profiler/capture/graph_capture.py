"""Hooked calls inside CUDA graphs that an engine captures by running its Python forward (SGLang).

SGLang captures its CUDA graphs at start-up: for each shape it runs the model's Python forward a
few times (warm-up) and once more while the stream captures, then replays the graph with no Python
layer running. So while a graph is being captured, a hooked call made **while the stream
captures** is kept as a :class:`~fi_profile.capture.traced.Template` of that graph (the calls it
would record at the captured shape; a live op's callable that builds each step's calls), not
recorded; the warm-up runs and the eager pieces of a breakable graph (which run again, hooked,
at every replay) are left out. Each replay of the graph then adds its templates to the step
(:func:`fi_profile.capture.graph_runs.count_graph_run`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Hashable, Iterator, Optional

from fi_profile.capture.kernel_accounting import ACCOUNTING, feeds_range
from fi_profile.capture.recorder import RECORDER
from fi_profile.capture.traced import Template, Trace, template

_NOTHING = contextlib.nullcontext()

#: the captured graphs of this process: the engine's key (its graph backend and shape) -> calls
CAPTURED: dict[Hashable, Trace] = {}


class _Capturing:
    trace: Optional[Trace] = None


#: the graph being captured now (None: none): read by every hooked call, so one attribute
CAPTURING = _Capturing()


@contextlib.contextmanager
def capturing(key: Hashable, where: str = "cuda_graph") -> Iterator[Trace]:
    """While the engine captures the graph ``key`` (``where``: how its calls run, for the record)."""
    outer = CAPTURING.trace
    trace = CAPTURING.trace = CAPTURED[key] = Trace(output_graph=0, symbols={}, where=where)
    try:
        yield trace
    finally:
        CAPTURING.trace = outer


def observe_captured(op: str, make_calls: Callable[[], Any], feeds: str = "") -> Optional[Template]:
    """A hooked call while a graph is being captured: a template of the graph if the stream is
    capturing it now (its first node, where it can be read: :func:`captured_nodes`), else nothing
    (a warm-up run, or an eager piece between graph segments). ``feeds``: :attr:`Template.feeds`."""
    trace = CAPTURING.trace
    if trace is not None and stream_capturing():
        made = template(op, make_calls)
        made.feeds = feeds
        return _captured(trace, made)
    return None


def observe_captured_prologue(op: str, definitions: tuple[str, ...]) -> Optional[Template]:
    """A prologue (:func:`fi_profile.capture.patching.wrap_prologue`) while a graph is being
    captured: a template of the graph that records nothing, its nodes ``definitions``' kernels."""
    trace = CAPTURING.trace
    if trace is not None and definitions and stream_capturing():
        return _captured(trace, Template(op, prologue=definitions))
    return None


def _captured(trace: Trace, made: Template) -> Template:
    first = captured_nodes()
    made.nodes = (first, first) if first is not None else None
    trace.templates.append(made)
    return made


def spanning(owner: str) -> Any:
    """The context a layer's method runs in whose own kernels (its splits and copies between its
    hooked inner calls) are its inner call's of op ``owner``, the layer's core op: SGLang's Gated
    DeltaNet layer splits its projections for the conv1d before its ``RadixLinearAttention``, which
    the hook records. While a CUDA graph is captured, that call's template spans the templates the
    method made (:attr:`Template.span`, as a traced method's: the accounting gives the method's
    kernels named after no family between them to the call), and the nodes the method launched
    after them are its too (:attr:`Template.tail`, where the graph's nodes can be read). Eagerly,
    while the engine's kernels are accounted for, the method runs in a range whose kernels outside
    its inner calls' ranges are the next ``owner`` call's
    (:func:`~fi_profile.capture.kernel_accounting.feeds_range`), which it makes. Else nothing."""
    trace = CAPTURING.trace
    if trace is not None and stream_capturing():
        return _captured_span(trace, owner)
    if trace is None and ACCOUNTING.active and RECORDER.active:
        return feeds_range(owner)
    return _NOTHING


@contextlib.contextmanager
def _captured_span(trace: Trace, owner: str) -> Iterator[None]:
    start = len(trace.templates)
    yield
    end = len(trace.templates)
    at = next((i for i in range(start, end) if trace.templates[i].op == owner), None)
    if at is None:
        return
    if end - start > 1:
        trace.templates[at].span = (at - start, end - at - 1)
    last, now = trace.templates[end - 1].nodes, captured_nodes()
    if last is not None and now is not None and now >= last[1]:
        trace.templates[at].tail = now - last[1]


def captured_call_ends(made: Optional[Template]) -> None:
    """The hooked call ``made`` a template of has run: the node after its last (its nodes are
    those between; unknown where either end is). A call that feeds another (:attr:`Template.feeds`)
    and made hooked calls inside it goes after them: its kernels are those after theirs (SGLang's
    fused shared expert: the gate's GEMM, a call of its own, then the sigmoid and the append that
    are the MoE's), its nodes those after theirs (unknown where it had some before them)."""
    if made is None:
        return
    last = captured_nodes() if made.nodes is not None else None
    if made.nodes is not None:
        made.nodes = (made.nodes[0], last) if last is not None and last >= made.nodes[0] else None
    trace = CAPTURING.trace
    at = next((i for i, t in enumerate(trace.templates) if t is made), None) if trace is not None else None
    if not made.feeds or at is None or at == len(trace.templates) - 1:
        return
    nested = trace.templates[at + 1:]
    del trace.templates[at]
    trace.templates.append(made)
    first, inner = nested[0].nodes, nested[-1].nodes
    own_before = made.nodes is None or first is None or first[0] != made.nodes[0]
    made.nodes = None if own_before or inner is None else (inner[1], made.nodes[1])


def captured_nodes() -> Optional[int]:
    """How many nodes the CUDA graph that the current stream captures holds so far (its kernels,
    memsets and copies, in the order the stream captured them), or None where it cannot be read
    (no capture, no driver library, a driver without the call). Read through the driver API
    (``cuStreamGetCaptureInfo_v2``, ``cuGraphGetNodes``), whose signatures are stable."""
    driver = _driver()
    if driver is None:
        return None
    import ctypes

    import torch

    status, graph, count = ctypes.c_int(0), ctypes.c_void_p(), ctypes.c_size_t(0)
    try:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if driver.cuStreamGetCaptureInfo_v2(stream, ctypes.byref(status), None, ctypes.byref(graph), None, None) \
                or status.value != 1 or not graph.value:  # CU_STREAM_CAPTURE_STATUS_ACTIVE
            return None
        if driver.cuGraphGetNodes(graph, None, ctypes.byref(count)):
            return None
    except Exception:  # noqa: BLE001 - unknown: the accounting aligns by names instead
        return None
    return int(count.value)


@functools.lru_cache(maxsize=1)
def _driver() -> Any:
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
        driver.cuStreamGetCaptureInfo_v2.restype = ctypes.c_int
        driver.cuGraphGetNodes.restype = ctypes.c_int
        return driver
    except (OSError, AttributeError):
        return None


def stream_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
