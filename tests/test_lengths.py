"""Request lengths: one for all, a range, or vLLM's range ratio; drawn per request, seeded."""

import pytest

from fi_profile.capture.engine_run import Scenario, prompts_for
from fi_profile.capture.lengths import Length


def test_a_single_length_and_a_range():
    assert Length.parse("32", "--input-len") == Length(32, 32)
    assert Length.parse("32:2048", "--input-len") == Length(32, 2048)
    assert str(Length(5, 5)) == "5" and str(Length(3, 9)) == "3:9"


def test_range_ratio_as_vllms_serving_benchmark():
    # vLLM's random dataset: floor(N * (1 - r)) .. ceil(N * (1 + r))
    assert Length.parse("1040", "--input-len", 0.969) == Length(32, 2048)
    assert Length.parse("10", "--output-len", 0.25) == Length(7, 13)


@pytest.mark.parametrize("text, ratio, message", [
    ("abc", 0.0, "--input-len 'abc': expected N or MIN:MAX"),
    ("0", 0.0, "each at least 1"),
    ("9:3", 0.0, "MIN is above MAX"),
    ("1:2:3", 0.0, "expected N or MIN:MAX"),
    ("3:9", 0.5, "a range and --range-ratio together"),
    ("10", 1.0, "--range-ratio 1.0: expected a value in [0, 1)"),
])
def test_bad_lengths_name_the_flag(text, ratio, message):
    with pytest.raises(ValueError, match=None) as raised:
        Length.parse(text, "--input-len", ratio)
    assert message in str(raised.value)


def test_drawn_lengths_are_per_request_seeded_and_in_range():
    scenario = Scenario.of_lengths(Length(8, 40), Length(2, 6), num_prompts=64, seed=3)
    prompts, outputs = scenario.prompt_lengths(), scenario.output_lengths()
    assert len(prompts) == len(outputs) == 64
    assert min(prompts) >= 8 and max(prompts) <= 40 and len(set(prompts)) > 10
    assert set(outputs) <= {2, 3, 4, 5, 6} and len(set(outputs)) > 1
    assert [len(p) for p in prompts_for(scenario, 100)] == prompts
    assert Scenario.of_lengths(Length(8, 40), Length(2, 6), num_prompts=64, seed=3).prompt_lengths() == prompts
    assert Scenario.of_lengths(Length(8, 40), Length(2, 6), num_prompts=64, seed=4).prompt_lengths() != prompts
    fixed = Scenario(num_prompts=3, input_len=20, output_len=5)  # the old form: every request the same
    assert fixed.prompt_lengths() == [20] * 3 and fixed.output_lengths() == [5] * 3
