"""The timed loop's stopping rule: a median known well enough stops it, else a cap does."""

import random
import time

import pytest
import torch

from fi_profile.replay.stopping import PRECISION, REPETITIONS_CAP, TIME_CAP, StoppingRule, median_rel_error
from fi_profile.replay.timing import measure

CPU = torch.device("cpu")


def test_the_medians_error_follows_the_spread_and_the_count():
    assert median_rel_error([2.0] * 50) == 0.0
    assert median_rel_error([1.0, 2.0]) == float("inf")  # too few to tell
    spread = [1.0 + 0.1 * (i % 11) for i in range(100)]  # IQR 0.6 (0.2..0.8) around a median of 1.5
    assert median_rel_error(spread) == pytest.approx(1.2533 * 0.6 / 1.349 / 10 / 1.5, rel=0.01)
    assert median_rel_error(spread * 4) == pytest.approx(median_rel_error(spread) / 2, rel=0.05)
    outliers = spread[:90] + [1000.0] * 10  # a few slow calls do not inflate it
    assert median_rel_error(outliers) < 2 * median_rel_error(spread)


def test_a_steady_call_stops_once_its_median_is_known():
    measured = measure(lambda: sum(range(2000)), lambda: None, CPU, rule=StoppingRule(max_time_s=5.0))
    stats = measured.stats()
    assert stats["stopped_by"] == PRECISION and stats["median_rel_error"] <= 0.01
    assert 10 <= stats["repetitions"] and sum(measured.times_ms) < 2_000  # long before the cap


def test_a_call_too_noisy_to_settle_stops_at_the_time_cap():
    rng = random.Random(0)
    began = time.perf_counter()
    measured = measure(lambda: time.sleep(rng.uniform(0, 2e-3)), lambda: None, CPU,
                       rule=StoppingRule(precision=1e-6, max_time_s=0.05))
    assert measured.stopped_by == TIME_CAP and 0.05 <= time.perf_counter() - began < 1.0
    assert measured.median_rel_error > 1e-6


def test_the_repetitions_cap_and_the_minimum_time_hold():
    assert measure(lambda: None, lambda: None, CPU, rule=StoppingRule(precision=-1.0, max_reps=25)).stopped_by \
        == REPETITIONS_CAP
    at_least = measure(lambda: time.sleep(1e-4), lambda: None, CPU, rule=StoppingRule(precision=0.05, min_time_s=0.05, max_time_s=5))
    assert sum(at_least.times_ms) >= 45 and at_least.stopped_by == PRECISION
    slow = measure(lambda: time.sleep(0.02), lambda: None, CPU, rule=StoppingRule(max_time_s=0.01))
    assert len(slow.times_ms) == 10  # the cap comes after the first 10 calls


def test_the_looks_come_after_the_first_calls_then_ever_further_apart():
    rule = StoppingRule(min_reps=10, check_every=8)
    sizes, reps = [], 0
    while reps < 200:
        sizes.append(rule.batch(reps))
        reps += sizes[-1]
    assert sizes[:3] == [10, 8, 9] and sizes[-1] == 67
    assert len(sizes) == 8  # a loop of 200 calls looks at its times 8 times, not 24


@pytest.mark.parametrize("errors", [[0.5435, 0.1343], [0.01], [0.3, 0.1, 0.2], [i / 100 for i in range(11)]])
def test_the_replays_summary_of_the_medians_errors_never_puts_a_higher_quantile_lower(errors):
    """``time_breakdown.json``'s spread of the medians' errors: median <= p90 <= max, each one of
    the errors (two pairs once read median 54%, p90 13%)."""
    from fi_profile.replay.breakdown import TimeBreakdown
    from fi_profile.replay.evaluate import Outcome

    breakdown = TimeBreakdown()
    for error in errors:
        breakdown.add(Outcome("passed", timing={"stopped_by": TIME_CAP, "median_rel_error": error}), 0.1, "torch")
    spread = breakdown.document(1.0, ["cpu"])["stopping"]["median_rel_error"]
    assert spread["median"] <= spread["p90"] <= spread["max"] == max(errors)
    assert {spread["median"], spread["p90"]} <= set(errors)
