"""Timing one callable, in the tone of ``triton.testing.do_bench``: untimed warm-up, then timed
calls until the median is known well enough or a cap is reached (:mod:`fi_profile.replay.stopping`),
reported as median, p10/p90 and coefficient of variation.

CUDA: before each call (outside the timed region) the L2 is flushed by reading a buffer of twice
its size, so every call starts with a cold L2 holding no dirty lines (a flush that writes, as
zeroing a buffer does, leaves the L2 full of dirty lines that the timed call must write back to
memory as it reads: a memory-bound GEMM of a decode step measured up to 1.3x slower for it; see
``benchmarks/l2_state.py``). With ``warm`` the call's per-step inputs (what the engine's previous
kernel has just written: activations, not weights or the KV cache) are then read back into the L2,
as they sit there when the engine runs the kernel. Then a spin kernel (``torch.cuda._sleep``) runs
for twice the host time one call takes to enqueue: while it spins, the host enqueues the call, so
what is timed is the device's work, not the host's launch overhead.

Two timers: ``kernels`` (the default), the durations CUPTI reports for the call's own kernels
(torch.profiler), summed: what the engine's kernel accounting
(:mod:`fi_profile.capture.kernel_accounting`) measures, without the µs or two an event pair adds
around a kernel of a few µs; ``events``, CUDA events around each call, which time the device from
the call's first launch to its last kernel's end, gaps between its kernels included. A call in
which CUPTI sees no kernel of its own (work off the GPU, or launched where CUPTI does not link it to
the call) is timed by events instead, and its ``method`` says so.
On CUDA the GPU's SM clock is sampled through the timed loop (NVML: :mod:`fi_profile.capture.gpu_clock`)
and reported beside the times: a kernel timed at the boost clock runs slower in an engine whose
load holds the clock down for power.
CPU: ``perf_counter`` around each call.
The output of the last timed call is returned, read after the call's end only (no device-wide
sync), so work left running on a side stream shows up as a wrong output.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch.profiler import ProfilerActivity

from fi_profile.capture.gpu_clock import ClockSampler, Reader, nvml_reader
from fi_profile.capture.kernel_accounting import is_cuda_launch
from fi_profile.replay.stopping import PRECISION, StoppingRule, median_rel_error


class NoKernelSeen(RuntimeError):
    """CUPTI linked no kernel to some timed call: it works off the GPU, or launches where CUPTI does
    not link the kernel to the call's range."""


@dataclass
class Measured:
    method: str
    times_ms: list[float]
    last_output: Any
    cold_l2: bool
    host_lead_us: float = 0.0
    #: whether the call's per-step inputs were read back into the L2 after the flush
    warm_inputs: bool = False
    #: the GPU's SM clock over the timed loop (NVML, sampled), and the share of samples with the
    #: clock held down for power or heat (None: not sampled)
    sm_clock_mhz: Optional[float] = None
    clock_limited_share: Optional[float] = None
    #: what ended the timed loop (:mod:`fi_profile.replay.stopping`), and the median's estimated
    #: relative standard error then
    stopped_by: Optional[str] = None
    median_rel_error: Optional[float] = None

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
            "warm_inputs": self.warm_inputs,
            "sm_clock_mhz": None if self.sm_clock_mhz is None else round(self.sm_clock_mhz, 1),
            "clock_limited_share": None if self.clock_limited_share is None else round(self.clock_limited_share, 3),
            "stopped_by": self.stopped_by,
            "median_rel_error": None if self.median_rel_error is None or not math.isfinite(self.median_rel_error)
            else round(self.median_rel_error, 5),
        }


DEFAULT_RULE = StoppingRule()
#: the timers: CUDA events around each call, or the durations of its own kernels (CUPTI)
TIMERS = ("events", "kernels")
#: the profiler range each timed call runs in, under the ``kernels`` timer
TIMED_RANGE = "fi-replay::timed"

_FLUSH: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_CLOCK_READERS: dict[int, Optional[Reader]] = {}
_SLEEP_CYCLES_PER_MS: dict[int, float] = {}


def _flush_l2(device: torch.device) -> None:
    """Read a buffer of twice the L2's size (into a scalar): the L2 then holds only its clean lines."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FLUSH:
        l2 = torch.cuda.get_device_properties(index).L2_cache_size
        _FLUSH[index] = (torch.ones(2 * l2 // 4, dtype=torch.float32, device=device),
                         torch.empty((), dtype=torch.float32, device=device))
    buffer, sink = _FLUSH[index]
    torch.sum(buffer, dim=0, out=sink)


def _clock_reader(device: torch.device) -> Optional[Reader]:
    """The device's SM clock reader (NVML), made once per device; None where there is none."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CLOCK_READERS:
        _CLOCK_READERS[index] = nvml_reader(index)
    return _CLOCK_READERS[index]


def read_back(tensors: Sequence[torch.Tensor]) -> None:
    """Read each tensor once on the device (a reduction of its bytes), leaving its lines in the L2."""
    for tensor in tensors:
        if tensor.numel():
            torch.amax(tensor.detach().reshape(-1).view(torch.uint8))


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
    rule: StoppingRule = DEFAULT_RULE,
    warmup_calls: int = 3,
    cuda_graph: bool = False,
    timer: str = "kernels",
    warm: Sequence[torch.Tensor] = (),
) -> Measured:
    """Time ``call`` (``prepare`` runs untimed before each) until ``rule`` stops the loop.
    ``timer``: one of :data:`TIMERS`; ``warm``: the call's per-step inputs, read back into the L2
    after each flush (none: all cold).
    On CUDA, ``device`` is made the current device meanwhile: events, the spin kernel and the
    call's own launches must all go to its streams (events recorded on another GPU time nothing)."""
    if timer not in TIMERS:
        raise ValueError(f"timer {timer!r}: expected one of {', '.join(TIMERS)}")
    if device.type != "cuda":
        _warm_up(call, prepare, warmup_calls)
        return _measure_cpu(call, prepare, rule)
    loop = _Loop(device, timer, warm, rule)
    with torch.cuda.device(device):
        try:
            if cuda_graph:
                return _measure_graph(call, prepare, loop, warmup_calls)
            enqueue_s = _warm_up(call, prepare, warmup_calls, device)
            return loop.run(call, prepare, "cuda_events" if timer == "events" else "cupti_kernels", enqueue_s)
        except NoKernelSeen:  # CUPTI links no kernel to the call: the events timer still sees its device time
            return measure(call, prepare, device, rule=rule, warmup_calls=warmup_calls, cuda_graph=cuda_graph,
                           timer="events", warm=warm)


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


@dataclass
class _Loop:
    """The timed loop on CUDA: before each call the L2 flushed (and the per-step inputs read back),
    a host lead spun; events around each call. The calls run in batches (:meth:`StoppingRule.batch`),
    after each of which the times so far decide whether to go on; under the ``kernels`` timer each
    batch is one CUPTI session (:class:`KernelSession`), so the loop decides on the kernels' own
    durations, steadier than the events around a call of a few µs, and a session's events stay few."""

    device: torch.device
    timer: str
    warm: Sequence[torch.Tensor]
    rule: StoppingRule

    def run(self, call, prepare, method: str, enqueue_s: float, result: Any = None) -> Measured:
        """``result`` overrides the call's return value as the output to snapshot (a graph replay
        returns nothing)."""
        lead_ms = min(2 * enqueue_s * 1e3 + 0.02, 10.0)
        lead_cycles = int(lead_ms * _sleep_cycles_per_ms(self.device))
        times: list[float] = []
        stopped_by = None
        read = _clock_reader(self.device)
        sampler = ClockSampler(read).start() if read is not None else None
        try:
            loop_start = time.perf_counter()
            while stopped_by is None:
                batch, output = self._batch(call, prepare, lead_cycles, len(times), loop_start)
                times += batch
                elapsed = time.perf_counter() - loop_start
                stopped_by = self.rule.capped(len(times), elapsed)
                if stopped_by is None and self.rule.settled(times, elapsed):
                    stopped_by = PRECISION
            last = _snapshot(output if result is None else result)
            torch.cuda.synchronize(self.device)
        finally:
            clock = sampler.stop() if sampler is not None else None
        return Measured(method, times, last, True, lead_ms * 1e3, bool(self.warm),
                        clock.mean_mhz() if clock is not None else None,
                        clock.limited_share() if clock is not None else None,
                        stopped_by, median_rel_error(times))

    def _batch(self, call, prepare, lead_cycles: int, done: int, loop_start: float) -> tuple[list[float], Any]:
        """The next batch of timed calls (cut short by a cap): their times (ms) and the last output."""
        session = KernelSession() if self.timer == "kernels" else contextlib.nullcontext()
        events = []
        with session:
            for _ in range(self.rule.batch(done)):
                prepare()
                _flush_l2(self.device)
                read_back(self.warm)
                torch.cuda._sleep(lead_cycles)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with _timed_range(self.timer):
                    start.record()
                    output = call()
                    end.record()
                events.append((start, end))
                if self.rule.capped(done + len(events), time.perf_counter() - loop_start):
                    break
            events[-1][1].synchronize()
        if self.timer != "kernels":
            return [s.elapsed_time(e) for s, e in events], output
        times = _kernel_times(session, len(events))
        if not all(times):
            raise NoKernelSeen(f"the kernels timer saw no kernel in {times.count(0.0)} of {len(times)} calls")
        return times, output


class KernelSession:
    """One CUPTI session through torch's Kineto binding (what ``torch.profiler.profile`` drives),
    without its Python layer: ``events()`` hands Kineto's own events over as they are. A batch of
    calls takes one, so its set-up counts per batch: on an H200 about 2 ms less than
    torch.profiler's (``benchmarks/kernels_timer_cost.py``)."""

    def __init__(self, activities: Sequence[ProfilerActivity] = (ProfilerActivity.CPU, ProfilerActivity.CUDA)) -> None:
        # torch's own binding (private: imported here, so that a torch without it fails the kernels
        # timer alone, which then says so, and leaves the CPU and events timers as they are)
        from torch._C._profiler import _ExperimentalConfig
        from torch.autograd import ProfilerConfig, ProfilerState

        self._config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
        self._activities = set(activities)
        self._result: Any = None

    def __enter__(self) -> "KernelSession":
        from torch.autograd import _enable_profiler, _prepare_profiler

        activities = self._activities
        _prepare_profiler(self._config, activities)  # Kineto takes one before each start
        _enable_profiler(self._config, activities)
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch.autograd import _disable_profiler

        self._result = _disable_profiler()

    def events(self) -> list[Any]:
        return self._result.events()


def _timed_range(timer: str):
    if timer != "kernels":
        return contextlib.nullcontext()
    return torch.profiler.record_function(TIMED_RANGE)


def _kernel_times(prof: Any, calls: int) -> list[float]:
    """Per timed call, the summed durations (ms) of the kernels (and copies) launched inside its range
    (``prof``: a finished :class:`KernelSession`)."""
    events = prof.events()
    cpu = [e for e in events if e.device_type() == torch.autograd.DeviceType.CPU]
    ranges = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in cpu if e.name() == TIMED_RANGE)
    if len(ranges) != calls:
        raise RuntimeError(f"the profiler saw {len(ranges)} timed ranges for {calls} calls")
    # a kernel and the CUDA API call that launched it (cudaLaunchKernel, cuLaunchKernelEx, a copy, a
    # graph launch) share CUPTI's correlation id; the launch lies inside its call's range (a Triton
    # kernel's has no operator around it to link to)
    launched = {e.correlation_id(): e.start_ns() for e in cpu if is_cuda_launch(e)}
    starts = [r[0] for r in ranges]
    times = [0.0] * calls
    for e in events:
        if e.device_type() == torch.autograd.DeviceType.CPU or e.is_user_annotation():
            continue
        at = launched.get(e.correlation_id())
        if at is None:
            continue
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at <= ranges[i][1]:
            times[i] += e.duration_ns() / 1e6
    return times


def _measure_cpu(call, prepare, rule: StoppingRule) -> Measured:
    times: list[float] = []
    output = None
    stopped_by = None
    loop_start = time.perf_counter()
    while stopped_by is None:
        prepare()
        t0 = time.perf_counter()
        output = call()
        times.append((time.perf_counter() - t0) * 1e3)
        elapsed = time.perf_counter() - loop_start
        stopped_by = rule.capped(len(times), elapsed)
        if stopped_by is None and rule.due(len(times)) and rule.settled(times, elapsed):
            stopped_by = PRECISION
    return Measured("cpu_wall", times, _snapshot(output), False, stopped_by=stopped_by,
                    median_rel_error=median_rel_error(times))


def _measure_graph(call, prepare, loop: _Loop, warmup_calls) -> Measured:
    """One call captured as a CUDA graph; each replay timed (launch gaps gone)."""
    device = loop.device
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
    method = "cuda_graph" if loop.timer == "events" else "cuda_graph_cupti_kernels"
    return loop.run(graph.replay, prepare, method, enqueue_s, result=output)


def _snapshot(output: Any) -> Any:
    """Copies of the output tensors, taken on the current stream."""
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, (tuple, list)):
        return type(output)(_snapshot(o) for o in output)
    if isinstance(output, dict):
        return {k: _snapshot(v) for k, v in output.items()}
    return output
