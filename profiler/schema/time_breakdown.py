"""``RESULTS/time_breakdown.json``: where a replay's time went (written by
:mod:`fi_profile.replay.breakdown`)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, NonNegativeFloat, NonNegativeInt

from fi_profile.schema.base import StrictModel


class Prewarmed(StrictModel):
    tasks: NonNegativeInt
    failed: NonNegativeInt


class SolutionTime(StrictModel):
    pairs: NonNegativeInt
    s: NonNegativeFloat


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
    #: per solution label: its pairs and the seconds their phases took
    by_solution: dict[str, SolutionTime]
