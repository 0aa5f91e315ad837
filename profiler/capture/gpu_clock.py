"""The GPU's SM clock as its driver reports it (NVML), sampled on a thread while kernels run: the
clock the engine's kernels ran at (kernel accounting) and the clock replay timed them at.

A compute-bound kernel's duration scales with the SM clock. Under sustained load a GPU lowers its
clock to stay within its power limit (NVML's clocks event reason "SW power cap"): through an
engine's long prefill steps an H100 ran at 1,300-1,700 MHz where replay, timing one kernel at a
time, mostly ran at its 1,980 MHz boost (BENCHMARKS.md). Both are measured here, never set: the
tool does not change the GPU's clocks.

Timestamps are ``time.time_ns()``; :func:`kineto_offset` finds what to add to them to put them on
the profiler's timeline (the offset between the two clocks, from a range opened at a known time).
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

#: seconds between two samples
SAMPLE_S = 0.01
#: NVML clocks event reasons that mean the clock was held down for power or heat: SW power cap,
#: HW slowdown, SW thermal slowdown, HW thermal slowdown, HW power brake
LIMITING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
#: the profiler range :func:`mark_sync` opens, and whose start :func:`kineto_offset` reads
SYNC_RANGE = "fi-clock::sync"
#: a sample stands for at most this long after it was taken (beyond: no clock known)
STALE_NS = 100_000_000

#: reads the device's (SM clock in MHz, clocks event reasons bitmask)
Reader = Callable[[], tuple[int, int]]


@dataclass
class ClockTrace:
    """Samples in time order: when each was taken (``time.time_ns()``), MHz, and whether the clock
    was held down for power or heat; ``offset_ns``: the timeline :meth:`at` is asked on, less
    ``time.time_ns()`` (the profiler's: :func:`kineto_offset`)."""

    times_ns: list[int] = field(default_factory=list)
    mhz: list[int] = field(default_factory=list)
    limited: list[bool] = field(default_factory=list)
    offset_ns: int = 0

    def at(self, t_ns: int) -> Optional[tuple[int, bool]]:
        """The clock at ``t_ns`` (on the shifted timeline): the latest sample taken before it, or the
        first one where ``t_ns`` is before every sample but within a sample's interval; None where
        no sample is near."""
        if not self.times_ns:
            return None
        t = t_ns - self.offset_ns
        i = bisect.bisect_right(self.times_ns, t) - 1
        if i < 0:
            i = 0
        if abs(t - self.times_ns[i]) > STALE_NS:
            return None
        return self.mhz[i], self.limited[i]

    def mean_mhz(self) -> Optional[float]:
        return sum(self.mhz) / len(self.mhz) if self.mhz else None

    def limited_share(self) -> Optional[float]:
        return sum(self.limited) / len(self.limited) if self.limited else None


class ClockSampler:
    """Samples ``read`` every :data:`SAMPLE_S` on a daemon thread between :meth:`start` and
    :meth:`stop`; one sample is taken at each end, so a short span still has two."""

    def __init__(self, read: Reader, interval_s: float = SAMPLE_S) -> None:
        self.read, self.interval_s = read, interval_s
        self.trace = ClockTrace()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> None:
        try:
            mhz, reasons = self.read()
        except Exception:  # noqa: BLE001 - a failed read loses one sample, never the run
            return
        self.trace.times_ns.append(time.time_ns())
        self.trace.mhz.append(int(mhz))
        self.trace.limited.append(bool(reasons & LIMITING))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> "ClockSampler":
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="fi-profile-clock", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ClockTrace:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return self.trace


def nvml_reader(device_index: Optional[int] = None) -> Optional[Reader]:
    """A reader of the current CUDA device's (or ``device_index``'s) SM clock and clocks event
    reasons through NVML (``nvidia-ml-py``); None where there is no NVML or no such GPU."""
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device() if device_index is None else device_index
        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, torch, index)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        sm = pynvml.NVML_CLOCK_SM

        def read() -> tuple[int, int]:
            return pynvml.nvmlDeviceGetClockInfo(handle, sm), reasons(handle)

        read()
        return read
    except Exception:  # noqa: BLE001 - no NVML, no driver, no GPU: no clocks, said where they would be shown
        return None


def _nvml_handle(pynvml: Any, torch: Any, index: int) -> Any:
    """The NVML handle of CUDA device ``index`` (NVML numbers devices by PCI order, CUDA by its own
    and ``CUDA_VISIBLE_DEVICES``): by the device's UUID where torch gives it."""
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    return torch.cuda._get_pynvml_handler(index)


def mark_sync() -> int:
    """Open and close the :data:`SYNC_RANGE` range (under a running profiler); returns the
    ``time.time_ns()`` it was opened at, for :func:`kineto_offset`."""
    import torch

    before = time.time_ns()
    with torch.autograd.profiler.record_function(SYNC_RANGE):
        after = time.time_ns()
    return (before + after) // 2


def kineto_offset(events: Sequence[Any], marked_ns: int) -> int:
    """What to add to a ``time.time_ns()`` to put it on the profiler's timeline: from the
    :data:`SYNC_RANGE` event among ``events`` (Kineto's) and the time it was opened at (0 where the
    profile lacks it: Kineto's timeline is the Unix epoch's in the torch versions seen)."""
    for event in events:
        if event.name() == SYNC_RANGE:
            return event.start_ns() - marked_ns
    return 0
