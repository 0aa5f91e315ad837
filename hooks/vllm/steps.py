"""vLLM's engine steps and graph runs: each engine step must have its model forward in the
record, and each run of a compiled forward or a whole-model CUDA graph adds the calls traced in
it (no Python hook runs inside either)."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

from fi_profile.capture.graph_runs import count_graph_run
from fi_profile.capture.kernel_accounting import ACCOUNTING, range_model_forward
from fi_profile.capture.recorder import RECORDER
from fi_profile.capture.traced import TRACES, sizes_of_run

#: vLLM's cudagraph runtime modes, as the record names them
_RUN_MODES = {"NONE": "compiled", "PIECEWISE": "piecewise_cuda_graph", "FULL": "full_cuda_graph"}


def compiled_forward(self: Any, *args: Any, **kwargs: Any) -> None:
    """``TorchCompileWithNoGuardsWrapper.__call__``: the compiled model forward is about to run."""
    _graph_run(self, args, kwargs)


def cuda_graph_call(self: Any, *args: Any, **kwargs: Any) -> None:
    """``CUDAGraphWrapper.__call__`` (and ``BreakableCUDAGraphWrapper``'s): a whole-model graph
    replays without calling the model. A piecewise graph, or a wrapper whose mode is not this
    step's, runs what it wraps: a compiled forward that counts itself."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return
    context = get_forward_context()
    mode = getattr(context.cudagraph_runtime_mode, "name", "NONE")
    own = getattr(getattr(self, "runtime_mode", None), "name", None)  # breakable graphs: none, any mode
    if mode == "NONE" or own == "PIECEWISE" or (own is not None and own != mode):
        return
    runnable = self.runnable
    trace = _traced_forward(self, runnable)
    sizes = sizes_of_run(trace, type(runnable).forward, (runnable, *args), kwargs)
    padded = getattr(getattr(context, "batch_descriptor", None), "num_tokens", None)
    for symbol, (name, _) in trace.symbols.items():  # the wrapped model may name its token inputs otherwise
        if symbol not in sizes and name in _TOKEN_ARGUMENTS and padded is not None:
            sizes[symbol] = int(padded)
    _count_compiled(trace, sizes, mode=_RUN_MODES.get(mode, "full_cuda_graph") if own else "breakable_cuda_graph")


def _traced_forward(wrapper: Any, runnable: Any) -> Any:
    """The trace of the forward a whole-model graph runs: the wrapped module's own, or that of the
    one module inside it whose forward torch.compile traced (the V1 runner wraps ``*ForCausalLM``,
    whose inner ``*Model`` is the compiled one). The module is found once per wrapper."""
    module = wrapper.__dict__.get("_fi_profile_traced")
    if module is None:
        found = [m for m in (runnable.modules() if hasattr(runnable, "modules") else (runnable,)) if _trace_of(m) is not None]
        if len(found) != 1:
            raise RuntimeError(
                f"a whole-model CUDA graph of {type(runnable).__name__} ran, and {len(found)} traced forwards are inside "
                f"it ({', '.join(type(m).__name__ for m in found) or 'none'}): its calls are not in the record")
        module = wrapper.__dict__["_fi_profile_traced"] = found[0]
    trace = _trace_of(module)
    if trace is None:
        raise RuntimeError(f"{type(module).__name__}'s forward is no longer traced: its calls are not in the record")
    return trace


def _trace_of(module: Any) -> Any:
    code = getattr(module, "original_code_object", None)
    return TRACES.get(code()) if callable(code) else None


def engine_step(self: Any, scheduler_output: Any, dummy_run: bool = False) -> Any:
    """``execute_model``: one engine step. A step that schedules tokens runs the model's forward,
    which must be in the record (:meth:`~fi_profile.capture.recorder.Recorder.engine_step`)."""
    tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
    if not RECORDER.active or dummy_run or tokens == 0:
        return contextlib.nullcontext()
    if ACCOUNTING.active and bool(getattr(getattr(self, "model_config", None), "enforce_eager", False)):
        # eager forwards told apart from the engine's own work around them (a compiled forward's
        # runs are graph runs already; its forward is left as torch.compile found it)
        range_model_forward(getattr(self, "model", None))
    per_request = list(getattr(scheduler_output, "num_scheduled_tokens", {}).values())
    decoding = sum(1 for n in per_request if n == 1)
    return RECORDER.engine_step(f"a step of {tokens} tokens for {len(per_request)} requests "
                                f"({decoding} decoding, {len(per_request) - decoding} prefilling)")


#: the compiled forward's arguments whose first dimension is the step's (padded) token count
_TOKEN_ARGUMENTS = ("input_ids", "positions", "inputs_embeds")


def _graph_run(model: Any, args: tuple, kwargs: dict) -> None:
    """One run of a compiled forward, with its real arguments (their sizes are the padded ones)."""
    trace = TRACES.get(model.original_code_object())
    if trace is None:
        raise RuntimeError(f"{type(model).__name__}'s compiled forward ran but was not traced in this process "
                           "(loaded from a compile cache?): its calls are not in the record")
    _count_compiled(trace, sizes_of_run(trace, type(model).forward, (model, *args), kwargs))


def full_graph_replay(self: Any, desc: Any) -> None:
    """The V2 model runner replays a whole-model (FULL) CUDA graph without calling the model: the
    padded token count is the descriptor's."""
    traces = [t for t in TRACES.values() if any(name in _TOKEN_ARGUMENTS for name, _ in t.symbols.values())]
    if len(traces) != 1:
        raise RuntimeError(f"a full CUDA graph replayed, but {len(traces)} traced model forwards could be it")
    trace = traces[0]
    _count_compiled(trace, {s: int(desc.num_tokens) for s, (name, _) in trace.symbols.items() if name in _TOKEN_ARGUMENTS},
                    mode="full_cuda_graph")


def _count_compiled(trace: Any, sizes: dict[str, int], mode: Optional[str] = None) -> None:
    """The traced templates as this step's calls (once per forward context: a full-graph wrapper
    that falls through to the model would count twice)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    context = get_forward_context() if is_forward_context_available() else None
    if context is not None:
        if context.attn_metadata is None or getattr(context, "_fi_profile_counted", False):
            return  # a dummy run, or this forward is counted already
        context._fi_profile_counted = True
        if mode is None:
            mode = _RUN_MODES.get(getattr(context.cudagraph_runtime_mode, "name", "NONE"), "compiled")
    ran_with = next((sizes[s] for s, (name, _) in trace.symbols.items() if name in _TOKEN_ARGUMENTS and s in sizes),
                    RECORDER.step_tokens)
    count_graph_run(trace, sizes, mode or "compiled", ran_with)
