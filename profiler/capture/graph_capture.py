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
from typing import Any, Callable, Hashable, Iterator, Optional

from fi_profile.capture.traced import Trace, template

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


def observe_captured(op: str, make_calls: Callable[[], Any]) -> str:
    """A hooked call while a graph is being captured: a template of the graph if the stream is
    capturing it now, else nothing (a warm-up run, or an eager piece between graph segments)."""
    trace = CAPTURING.trace
    if trace is not None and stream_capturing():
        trace.templates.append(template(op, make_calls))
    return op


def stream_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
