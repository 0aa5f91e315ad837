"""``RESULTS/time_breakdown.json``: where a replay's time went (written by
:mod:`fi_profile.replay.breakdown`)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, NonNegativeFloat, NonNegativeInt

from fi_profile.schema.base import StrictModel


class Prewarmed(StrictModel):
    tasks: NonNegativeInt
    #: the warm-ups that did not pass, by how they ended (``timeout``, ``crashed``, ``failed``, ...)
    failed: dict[str, NonNegativeInt]
    #: the warm-ups dropped or killed once the pairs were done (or stopped): of no more use then
    cancelled: NonNegativeInt = 0


class SolutionTime(StrictModel):
    pairs: NonNegativeInt
    s: NonNegativeFloat


class Spread(StrictModel):
    median: NonNegativeFloat
    p90: NonNegativeFloat
    max: NonNegativeFloat


class Stopping(StrictModel):
    """What the timed loops' stopping rule cost in precision (replay/stopping.py)."""

    #: pairs by what ended their timed loop: precision, time cap, repetitions cap
    pairs_stopped_by: dict[str, NonNegativeInt]
    #: the medians' estimated relative standard errors over the timed pairs (None: none timed)
    median_rel_error: Optional[Spread] = None


class TimeBreakdownDocument(StrictModel):
    pairs: NonNegativeInt
    wall_s: NonNegativeFloat
    pairs_per_minute: Optional[NonNegativeFloat] = None
    devices: list[str] = Field(min_length=1)
    #: seconds per phase (build, first call, inputs, reference, check, timed calls), summed over the pairs
    phases_s: dict[str, NonNegativeFloat]
    worker_start_and_transfer_s: NonNegativeFloat
    pairs_wall_s: NonNegativeFloat
    prewarmed: Prewarmed
    stopping: Optional[Stopping] = None
    #: per solution label: its pairs and the seconds their phases took
    by_solution: dict[str, SolutionTime]
