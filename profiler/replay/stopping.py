"""When a pair's timed loop stops: once its median is known well enough, not after a fixed time.

The median's relative standard error is estimated from the times so far, robustly: the spread as
the interquartile range (σ ≈ IQR / 1.349, so a few slow outliers do not inflate it) and the
median's standard error as 1.2533 σ / √n (its large-sample value). The loop stops once that is
under ``precision`` (after ``min_reps`` calls and ``min_time_s``), or at ``max_time_s`` or
``max_reps``, whichever comes first; the result says which stopped it and the error reached
(``timing.stopped_by``, ``timing.median_rel_error``). gpu-mode's eval repeats the same way, until a
relative error (of the mean) or a time cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

#: how the loop ended
PRECISION, TIME_CAP, REPETITIONS_CAP = "precision", "time cap", "repetitions cap"


def median_rel_error(times: Sequence[float]) -> float:
    """The median's estimated relative standard error (0 for fewer than 4 times' spread)."""
    t = sorted(times)
    n = len(t)
    if n < 4:
        return math.inf
    median = t[n // 2] if n % 2 else (t[n // 2 - 1] + t[n // 2]) / 2
    q1, q3 = t[(n - 1) // 4], t[(3 * (n - 1)) // 4]
    if median <= 0:
        return 0.0 if q3 - q1 == 0 else math.inf
    return 1.2533 * (q3 - q1) / 1.349 / math.sqrt(n) / median


@dataclass(frozen=True)
class StoppingRule:
    precision: float = 0.01
    min_reps: int = 10
    max_reps: int = 100_000
    min_time_s: float = 0.0
    max_time_s: float = 0.1
    #: calls between two looks at the times (on CUDA each look waits for the device), at least
    check_every: int = 8

    def batch(self, reps: int) -> int:
        """How many calls to make before the next look, after ``reps``: ``min_reps`` first, then
        half as many as so far (at least ``check_every``), so that the looks (on CUDA each a wait
        for the device, under the kernels timer a CUPTI session) stay few however long the loop."""
        return self.min_reps if reps < self.min_reps else max(self.check_every, reps // 2)

    def due(self, reps: int) -> bool:
        """Whether to look at the times after ``reps`` calls."""
        return reps >= self.min_reps and (reps - self.min_reps) % self.check_every == 0

    def capped(self, reps: int, elapsed_s: float) -> Optional[str]:
        """The cap that stops the loop after ``reps`` calls in ``elapsed_s``, or None."""
        if reps >= self.max_reps:
            return REPETITIONS_CAP
        if reps >= self.min_reps and elapsed_s >= self.max_time_s:
            return TIME_CAP
        return None

    def settled(self, times: Sequence[float], elapsed_s: float) -> bool:
        """Whether the median of ``times`` is known to ``precision``."""
        return len(times) >= self.min_reps and elapsed_s >= self.min_time_s and \
            median_rel_error(times) <= self.precision
