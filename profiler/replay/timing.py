"""Timing one callable, in the tone of ``triton.testing.do_bench``: untimed warm-up, then timed
calls until enough time has passed, reported as median, p10/p90 and coefficient of variation.

CUDA: each call between two events on the current stream; before each call (outside the timed
region) a buffer of twice the L2 size is zeroed, so every call starts with a cold L2 and the
preparation (poisoning outputs) is not timed either. Then a spin kernel (``torch.cuda._sleep``)
runs for twice the host time one call takes to enqueue: while it spins, the host enqueues the
start event, the call and the end event, so the events time the device's work, not the host's
launch overhead (which otherwise shows up in calls of a few microseconds, by how fast the host is).
CPU: ``perf_counter`` around each call.
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
    host_lead_us: float = 0.0

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
            "host_lead_us": self.host_lead_us,
        }


_FLUSH: dict[int, torch.Tensor] = {}
_SLEEP_CYCLES_PER_MS: dict[int, float] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FLUSH:
        l2 = torch.cuda.get_device_properties(index).L2_cache_size
        _FLUSH[index] = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return _FLUSH[index]


def _sleep_cycles_per_ms(device: torch.device) -> float:
    """How many ``torch.cuda._sleep`` cycles one millisecond holds on this device (measured once)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SLEEP_CYCLES_PER_MS:
        cycles = 1_000_000
        torch.cuda._sleep(cycles)  # first launch: module load
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_MS[index] = cycles / start.elapsed_time(end)
    return _SLEEP_CYCLES_PER_MS[index]


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
    """Time ``call`` (``prepare`` runs untimed before each); the loop runs for ``min_time_s``.
    On CUDA, ``device`` is made the current device meanwhile: events, the spin kernel and the
    call's own launches must all go to its streams (events recorded on another GPU time nothing)."""
    if device.type != "cuda":
        _warm_up(call, prepare, warmup_calls)
        return _measure_cpu(call, prepare, min_time_s, min_reps, max_reps)
    with torch.cuda.device(device):
        if cuda_graph:
            return _measure_graph(call, prepare, device, min_time_s, min_reps, max_reps, warmup_calls)
        enqueue_s = _warm_up(call, prepare, warmup_calls, device)
        return _event_loop(call, prepare, device, "cuda_events", min_time_s, min_reps, max_reps, enqueue_s)


def _warm_up(call, prepare, calls: int, device: torch.device | None = None) -> float:
    """Untimed calls (JIT, autotuning, allocator, lazy init); returns the host time the fastest
    one took to return, which on CUDA is its enqueue time (the device is idle before each)."""
    fastest = float("inf")
    for _ in range(max(calls, 2)):
        prepare()
        if device is not None:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - start)
    if device is not None:
        torch.cuda.synchronize(device)
    return fastest


def _event_loop(call, prepare, device, method, min_time_s, min_reps, max_reps, enqueue_s, result=None) -> Measured:
    """Events around each call, the L2 flushed and a host lead spun before each; ``result``
    overrides the call's return value as the output to snapshot (a graph replay returns nothing)."""
    flush = _flush_buffer(device)
    lead_ms = min(2 * enqueue_s * 1e3 + 0.02, 10.0)
    lead_cycles = int(lead_ms * _sleep_cycles_per_ms(device))
    starts, ends = [], []
    output = None
    loop_start = time.perf_counter()
    while len(starts) < max_reps and (len(starts) < min_reps or time.perf_counter() - loop_start < min_time_s):
        prepare()
        flush.zero_()
        torch.cuda._sleep(lead_cycles)
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
    return Measured(method, [s.elapsed_time(e) for s, e in zip(starts, ends)], last, True, lead_ms * 1e3)


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


def _measure_graph(call, prepare, device, min_time_s, min_reps, max_reps, warmup_calls) -> Measured:
    """One call captured as a CUDA graph; each replay timed (launch gaps gone), L2 flushed between."""
    _warm_up(call, prepare, warmup_calls, device)
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
    enqueue_s = _warm_up(graph.replay, prepare, 2, device)
    return _event_loop(graph.replay, prepare, device, "cuda_graph", min_time_s, min_reps, max_reps, enqueue_s, result=output)


def _snapshot(output: Any) -> Any:
    """Copies of the output tensors, taken on the current stream."""
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, (tuple, list)):
        return type(output)(_snapshot(o) for o in output)
    if isinstance(output, dict):
        return {k: _snapshot(v) for k, v in output.items()}
    return output
