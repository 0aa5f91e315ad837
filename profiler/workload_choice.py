"""Which workloads of a Definition are kept when there are more than a cap: one rule, used where a
capture writes its workloads and where a replay is told ``--max-workloads``.

The most frequent half of the cap, then the rest spread evenly over the remaining axis values,
both ends included, so rare shapes at both ends of the range stay represented (a rare long prefill
weighs more in the model's time than its count says). Workloads as frequent as the first one the
half leaves out are no more frequent than it: they go to the spread too, never picked by their
axis values (every decode step of a capture has a shape of its own, all of one count: the half
would be the smallest batches)."""

from __future__ import annotations

import math
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def choose_workloads(workloads: Sequence[T], cap: int, count: Callable[[T], int],
                     axes: Callable[[T], dict[str, int]]) -> list[T]:
    """At most ``cap`` of ``workloads``, most frequent first (``count``, ``axes``: read from each)."""
    by_count = sorted(workloads, key=lambda w: (-count(w), sorted(axes(w).items())))
    if len(by_count) <= cap:
        return by_count
    half = math.ceil(cap / 2)
    cut = count(by_count[half])  # the most frequent of those the half leaves out
    chosen = [w for w in by_count[:half] if count(w) > cut]
    rest = sorted(by_count[len(chosen):], key=lambda w: sorted(axes(w).items()))
    need = cap - len(chosen)
    if need == 1:
        chosen.append(rest[-1])  # the largest: what a projection can least guess from the others
    elif need:
        chosen += [rest[round(i * (len(rest) - 1) / (need - 1))] for i in range(need)]  # both ends, evenly between
    return chosen
