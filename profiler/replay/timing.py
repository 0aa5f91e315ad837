"""Timing one callable, in the tone of ``triton.testing.do_bench``: untimed warm-up, then timed
calls until enough time has passed, reported as median, p10/p90 and coefficient of variation.

CUDA: each call between two events on the current stream; before each call (outside the timed
region) a buffer of twice the L2 size is zeroed, so every call starts with a cold L2 and the
preparation (poisoning outputs) is not timed either. CPU: ``perf_counter`` around each call.
The output of the last timed call is returned, read after its end event only (no device-wide
sync), so work left running on a side stream shows up as a wrong output.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass
class Measured:
    method: str
    times_ms: list[float]
    last_output: Any
    cold_l2: bool

    def stats(self) -> dict[str, Any]:
        t = sorted(self.times_ms)
        median = statistics.median(t)
        mean = statistics.fmean(t)
        cv = statistics.pstdev(t) / mean if mean > 0 and len(t) > 1 else 0.0
        return {
            "method": self.method,
            "repetitions": len(t),
            "median_ms": median,
            "p10_ms": t[int(0.1 * (len(t) - 1))],
            "p90_ms": t[int(0.9 * (len(t) - 1))],
            "cv": cv,
            "cold_l2": self.cold_l2,
        }


_FLUSH: dict[int, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FLUSH:
        l2 = torch.cuda.get_device_properties(index).L2_cache_size
        _FLUSH[index] = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return _FLUSH[index]


def measure(
    call: Callable[[], Any],
    prepare: Callable[[], None],
    device: torch.device,
    *,
    min_time_s: float = 0.1,
    min_reps: int = 10,
    max_reps: int = 100_000,
    warmup_calls: int = 3,
    cuda_graph: bool = False,
) -> Measured:
    """Time ``call`` (``prepare`` runs untimed before each); the loop runs for ``min_time_s``."""
    for _ in range(warmup_calls):  # JIT, autotuning, allocator, lazy init
        prepare()
        call()
    if device.type != "cuda":
        return _measure_cpu(call, prepare, min_time_s, min_reps, max_reps)
    torch.cuda.synchronize(device)
    if cuda_graph:
        return _measure_graph(call, prepare, device, min_time_s, min_reps, max_reps)
    return _event_loop(call, prepare, device, "cuda_events", min_time_s, min_reps, max_reps)


def _event_loop(call, prepare, device, method, min_time_s, min_reps, max_reps, result=None) -> Measured:
    """Events around each call, the L2 flushed before each; ``result`` overrides the call's
    return value as the output to snapshot (a graph replay returns nothing)."""
    flush = _flush_buffer(device)
    starts, ends = [], []
    output = None
    loop_start = time.perf_counter()
    while len(starts) < max_reps and (len(starts) < min_reps or time.perf_counter() - loop_start < min_time_s):
        prepare()
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        output = call()
        end.record()
        starts.append(start)
        ends.append(end)
        if len(starts) % 256 == 0:
            end.synchronize()  # keep the host from running far ahead of the device
    ends[-1].synchronize()
    last = _snapshot(output if result is None else result)
    torch.cuda.synchronize(device)
    return Measured(method, [s.elapsed_time(e) for s, e in zip(starts, ends)], last, True)


def _measure_cpu(call, prepare, min_time_s, min_reps, max_reps) -> Measured:
    times = []
    output = None
    loop_start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - loop_start < min_time_s):
        prepare()
        t0 = time.perf_counter()
        output = call()
        times.append((time.perf_counter() - t0) * 1e3)
    return Measured("cpu_wall", times, _snapshot(output), False)


def _measure_graph(call, prepare, device, min_time_s, min_reps, max_reps) -> Measured:
    """One call captured as a CUDA graph; each replay timed (launch gaps gone), L2 flushed between."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        prepare()
        call()  # one more warm-up on the capture stream
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    prepare()
    with torch.cuda.graph(graph):
        output = call()
    return _event_loop(graph.replay, prepare, device, "cuda_graph", min_time_s, min_reps, max_reps, result=output)


def _snapshot(output: Any) -> Any:
    """Copies of the output tensors, taken on the current stream."""
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, (tuple, list)):
        return type(output)(_snapshot(o) for o in output)
    if isinstance(output, dict):
        return {k: _snapshot(v) for k, v in output.items()}
    return output
