"""Where a replay's time went: each pair's phases (build, first call (JIT, torch.compile,
autotuning), input synthesis, reference runs, checks, timed calls) summed over the run and per
solution label (``torch_compile``, ``flashinfer``...), beside the pairs' wall time as the runner saw
it (the rest: worker starts and transfers) and the run's own wall time. Kept as
``RESULTS/time_breakdown.json`` and printed at the end of a replay."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from fi_profile.replay.evaluate import Outcome
from fi_profile.schema.time_breakdown import TimeBreakdownDocument

PHASES = ("build", "first call", "inputs", "reference", "check", "timed calls")
FILE = "time_breakdown.json"


class TimeBreakdown:
    def __init__(self) -> None:
        self.phases: Counter[str] = Counter()
        #: solution label -> [pairs, seconds in phases]
        self.by_label: dict[str, list[float]] = {}
        self.pairs = 0
        self.pairs_wall_s = 0.0
        #: warm-ups run up front in parallel (replay/prewarm.py), those that did not pass by how they
        #: ended, and those cancelled once the pairs were done
        self.prewarmed: tuple[int, dict[str, int], int] = (0, {}, 0)
        #: what stopped each timed pair's loop, and the median's relative standard error it had then
        self.stopped_by: Counter[str] = Counter()
        self.rel_errors: list[float] = []
        self._lock = threading.Lock()

    def add(self, outcome: Outcome, wall_s: Optional[float], label: str) -> None:
        """One pair's phases; ``wall_s``: how long the runner waited for it (None: not known);
        ``label``: the solution's label (``reference`` for the Definition's own)."""
        with self._lock:
            self.phases.update(outcome.phases)
            pairs_seconds = self.by_label.setdefault(label, [0, 0.0])
            pairs_seconds[0] += 1
            pairs_seconds[1] += sum(outcome.phases.values())
            self.pairs += 1
            self.pairs_wall_s += sum(outcome.phases.values()) if wall_s is None else wall_s
            timing = outcome.timing or {}
            if timing.get("stopped_by"):
                self.stopped_by[timing["stopped_by"]] += 1
            if timing.get("median_rel_error") is not None:
                self.rel_errors.append(timing["median_rel_error"])

    def document(self, wall_s: float, devices: list[str]) -> dict[str, Any]:
        in_phases = sum(self.phases.values())
        phases = {p: round(self.phases.get(p, 0.0), 3) for p in PHASES}
        phases.update({p: round(s, 3) for p, s in self.phases.items() if p not in PHASES})
        return {
            "pairs": self.pairs,
            "wall_s": round(wall_s, 3),
            "pairs_per_minute": round(self.pairs / wall_s * 60, 1) if wall_s > 0 else None,
            "devices": devices,
            "phases_s": phases,
            "worker_start_and_transfer_s": round(max(0.0, self.pairs_wall_s - in_phases), 3),
            "pairs_wall_s": round(self.pairs_wall_s, 3),
            "prewarmed": {"tasks": self.prewarmed[0], "failed": dict(self.prewarmed[1]), "cancelled": self.prewarmed[2]},
            "stopping": self._stopping(),
            "by_solution": {label: {"pairs": int(n), "s": round(s, 3)}
                            for label, (n, s) in sorted(self.by_label.items(), key=lambda kv: -kv[1][1])},
        }

    def _stopping(self) -> dict[str, Any]:
        """What the stopping rule cost in precision: the pairs each reason stopped, and the
        medians' estimated relative standard errors over the timed pairs."""
        errors = sorted(self.rel_errors)
        spread = {"median": _nearest_rank(errors, 0.5), "p90": _nearest_rank(errors, 0.9),
                  "max": errors[-1]} if errors else None
        return {"pairs_stopped_by": dict(self.stopped_by), "median_rel_error": spread}

    def write(self, out_dir: Path, wall_s: float, devices: list[str]) -> dict[str, Any]:
        document = TimeBreakdownDocument.model_validate(self.document(wall_s, devices)).model_dump(mode="json")
        (out_dir / FILE).write_text(json.dumps(document, indent=1) + "\n")
        return document


def _nearest_rank(ordered: list[float], q: float) -> float:
    """The value at quantile ``q`` of ``ordered`` (sorted), the one nearest that rank: one rule for
    every quantile, so a higher quantile is never a lower value (two errors once read median 54%, p90 13%)."""
    return ordered[int(q * (len(ordered) - 1) + 0.5)]
