"""SGLang's model steps and CUDA graphs: ``ModelRunner.forward`` is the step boundary (its
forward must be in the record), and the layer calls a CUDA graph backend captured by running the
model are that graph's, counted at each replay."""

from __future__ import annotations

import contextlib
from typing import Any

from fi_profile.capture.graph_capture import CAPTURED, capturing
from fi_profile.capture.graph_runs import count_graph_run
from fi_profile.capture.kernel_accounting import ACCOUNTING, range_model_forward
from fi_profile.capture.paged_layout import step_shape
from fi_profile.capture.recorder import RECORDER
from fi_profile.hooks.sglang.attention import STEP, step_layout


def model_step(self: Any, forward_batch: Any) -> Any:
    """``ModelRunner.forward``: one model step, the step boundary. A step with requests runs the
    model's forward, which must be in the record (:meth:`~fi_profile.capture.recorder.Recorder.engine_step`)."""
    if not RECORDER.active:
        return contextlib.nullcontext()
    if ACCOUNTING.active:  # its eager forwards told apart from the engine's own work around them
        range_model_forward(getattr(self, "model", None))
    STEP.begin(runner=self, batch=forward_batch)
    layout = step_layout(forward_batch)
    if layout is None:
        return contextlib.nullcontext()
    shape = step_shape(layout[0], len(layout[1]))
    RECORDER.begin_step(shape, tokens=shape[0])
    mode = getattr(forward_batch.forward_mode, "name", "model").lower()
    return RECORDER.engine_step(f"a {mode} step of {shape[0]} tokens for {len(layout[1])} requests")


#: SGLang's CUDA graph backends that capture by running the model's Python forward (its layer
#: calls are kept while captured: :mod:`fi_profile.capture.graph_capture`), and how each replays
_CAPTURED_BACKENDS = {"FullCudaGraphBackend": "full_cuda_graph", "BreakableCudaGraphBackend": "piecewise_cuda_graph"}


def graph_runner_runs(self: Any) -> None:
    """One of SGLang's graph runners runs this step (``execute``): its layer calls are recorded only
    where its backend captured them by running the model (replayed in :func:`graph_replay`); any
    other (the CPU graph runner, torch.compile backends) is said, never silently dropped."""
    backend = type(getattr(self, "backend", None)).__name__
    if backend not in _CAPTURED_BACKENDS:
        raise NotImplementedError(
            f"this step runs SGLang's {type(self).__name__} ({backend}), whose layer calls fi-profile does not "
            "record: they are not in the record (capture with --eager)"
        )


def graph_capture(self: Any, shape_key: Any) -> Any:
    """A CUDA graph backend's ``capture_one``: the layer calls made while it captures are the graph's."""
    return capturing((self, shape_key), where="cuda_graph")


def graph_replay(self: Any, shape_key: Any) -> None:
    """A CUDA graph backend's ``replay``: the graph's captured calls, at its (padded) size."""
    trace = CAPTURED.get((self, shape_key))
    if trace is None or not trace.templates:
        raise RuntimeError(
            f"SGLang's {type(self).__name__} replayed a CUDA graph of size {shape_key.size} in which no hooked layer "
            "call was captured (compiled with torch.compile, or captured before the hooks were installed): its calls "
            "are not in the record (capture with --eager)"
        )
    count_graph_run(trace, {}, _CAPTURED_BACKENDS.get(type(self).__name__, "cuda_graph"), int(shape_key.size))
