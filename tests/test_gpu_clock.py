"""The GPU's SM clock beside the kernel times (profiler/capture/gpu_clock.py): sampled on a thread,
put on the profiler's timeline, weighed by the kernels' time in the engine's accounting and by the
counts in the projection, and named where a projection is off. NVML itself needs a GPU; here the
reader is a function of time, and the profiles are made up event by event (test_kernel_accounting)."""

from __future__ import annotations

import time

import pytest
from test_kernel_accounting import LAYER, OP_TYPES, Event, GpuProfile

from fi_profile.capture.gpu_clock import LIMITING, SYNC_RANGE, ClockSampler, ClockTrace, kineto_offset, nvml_reader
from fi_profile.capture.kernel_accounting import CALL_RANGE, GRAPH_RANGE, GraphCalls, attribute, merged
from fi_profile.families import KERNEL_WORDS


def test_the_sampler_takes_samples_through_the_span_and_one_at_each_end():
    clock = iter(range(1000, 100_000))
    sampler = ClockSampler(lambda: (next(clock), 0x4 if sampler.trace.mhz and len(sampler.trace.mhz) % 2 else 0),
                           interval_s=0.002).start()
    time.sleep(0.05)
    trace = sampler.stop()
    assert len(trace.mhz) >= 5 and trace.mhz == sorted(trace.mhz)  # in order, every one kept
    assert trace.times_ns == sorted(trace.times_ns)
    assert 0 < trace.limited_share() < 1
    assert sampler._thread is not None and not sampler._thread.is_alive()


def test_a_failed_read_loses_a_sample_not_the_run():
    calls = []

    def read():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("NVML busy")
        return 1500, 0

    trace = ClockSampler(read, interval_s=0.002).start()
    time.sleep(0.02)
    trace = trace.stop()
    assert len(trace.mhz) == len(calls) - 1 and set(trace.mhz) == {1500}


def test_the_clock_at_a_time_is_the_latest_sample_before_it_on_the_shifted_timeline():
    trace = ClockTrace(times_ns=[1_000, 2_000, 3_000], mhz=[1980, 1600, 1700], limited=[False, True, True],
                       offset_ns=500)
    assert trace.at(1_500) == (1980, False)  # 1,500 on the profiler's timeline is 1,000 on the sampler's
    assert trace.at(2_499) == (1980, False)
    assert trace.at(2_500) == (1600, True)
    assert trace.at(1_400) == (1980, False)  # just before the first sample: the first
    assert trace.at(3_500 + 200_000_000) is None  # long after the last: unknown, not the last
    assert ClockTrace().at(0) is None


def test_the_sync_range_gives_the_offset_between_the_two_clocks():
    events = [Event("aten::mm", 10, 5), Event(SYNC_RANGE, 7_000_123, 2, annotation=True)]
    assert kineto_offset(events, 123) == 7_000_000
    assert kineto_offset(events[:1], 123) == 0


def test_no_nvml_means_no_reader_not_an_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: NVML may answer")
    assert nvml_reader() is None


def _clocked_profile():
    """A GEMM call and a norm call (at 10,000,000 ns and after on the GPU), then a graph run of a layer."""
    profile = GpuProfile()
    profile.range(CALL_RANGE + "gemm_qkv", lambda: profile.launch(("nvjet_tst_128x256", 100)))
    profile.range(CALL_RANGE + "rmsnorm_h64", lambda: profile.launch(("rms_norm_kernel", 50)))
    profile.gpu_clock = 20_000_000
    kernels = [("triton_red_fused_rms_norm_0", 3), ("nvjet_tst_64x8", 20), ("splitKreduce_kernel", 2),
               ("triton_poi_fused_3", 4), ("triton_poi_fused_4", 1),
               ("reshape_and_cache_kernel_flash", 5), ("kernel_unified_attention_2d", 30),
               ("nvjet_tst_64x8", 10), ("triton_red_fused_fused_add_rms_norm_1", 3)]
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    profile.launch(("reshape_and_cache_kernel_flash", 24))  # outside every range, at the graph's clock
    return profile


def test_each_kernels_time_is_weighed_by_the_clock_it_ran_at_per_definition_and_in_total():
    profile = _clocked_profile()
    # the GEMM's kernel at 10,000,000 ns ran at 1,500 MHz held down for power; from 10,000,050 on
    # (the norm's kernel and the graph's) the clock was back at 1,980 MHz
    trace = ClockTrace(times_ns=[9_000_000, 10_000_050], mhz=[1500, 1980], limited=[True, False])
    result = attribute(profile.events, [GraphCalls(tuple(LAYER))], KERNEL_WORDS, OP_TYPES,
                       clock=trace, clock_marked_ns=None)
    part = result.part()
    assert part["clocked"]["gemm_qkv"] == [100 * 1500 + 22 * 1980, 122]  # its own call, then its graph kernels
    assert part["clocked"]["rmsnorm_h64"] == [50 * 1980 + 3 * 1980, 53]
    total_ns = 100 + 50 + 78 + 24
    assert part["clock_total"] == [100 * 1500 + (total_ns - 100) * 1980, total_ns, 100]
    kernels = merged([part, part])
    assert kernels.by_definition["gemm_qkv"].sm_clock_mhz == pytest.approx((100 * 1500 + 22 * 1980) / 122, abs=0.05)
    assert kernels.sm_clock_mhz == pytest.approx((100 * 1500 + (total_ns - 100) * 1980) / total_ns, abs=0.05)
    assert kernels.clock_limited_share == pytest.approx(100 / total_ns, abs=1e-4)


def test_without_samples_or_on_cpu_no_clock_is_claimed():
    profile = _clocked_profile()
    result = attribute(profile.events, [GraphCalls(tuple(LAYER))], KERNEL_WORDS, OP_TYPES)
    kernels = merged([result.part()])
    assert kernels.sm_clock_mhz is None and kernels.clock_limited_share is None
    assert all(d.sm_clock_mhz is None for d in kernels.by_definition.values())
    # samples far from every kernel: unknown, not the nearest
    far = ClockTrace(times_ns=[1_000_000_000_000], mhz=[1400], limited=[True])
    kernels = merged([attribute(profile.events, [GraphCalls(tuple(LAYER))], KERNEL_WORDS, OP_TYPES, clock=far).part()])
    assert kernels.sm_clock_mhz is None


def test_the_clock_is_aligned_through_the_sync_range():
    profile = _clocked_profile()
    # the sampler's clock runs 5,000,000 ns behind the profiler's; the sync range was opened at 1 on it
    profile.events.append(Event(SYNC_RANGE, 5_000_001, 1, annotation=True))
    trace = ClockTrace(times_ns=[4_000_000, 5_000_050], mhz=[1500, 1980], limited=[True, False])
    result = attribute(profile.events, [GraphCalls(tuple(LAYER))], KERNEL_WORDS, OP_TYPES, clock=trace,
                       clock_marked_ns=1)
    assert result.part()["clocked"]["gemm_qkv"][0] == 100 * 1500 + 22 * 1980


def test_the_limiting_reasons_are_power_and_heat_not_idle():
    assert LIMITING & 0x4 and LIMITING & 0x40  # SW power cap, HW thermal slowdown
    assert not LIMITING & 0x1  # GPU idle
    assert not LIMITING & 0x2  # applications clocks setting: the user's, not the load's


def _result(kernel: str, workload: str, source: str, ms: float, mhz):
    from fi_profile.schema import BenchmarkResult

    timing = {"method": "cupti_kernels", "repetitions": 10, "median_ms": ms, "p10_ms": ms, "p90_ms": ms, "cv": 0.0,
              "cold_l2": True, "sm_clock_mhz": mhz}
    return BenchmarkResult.model_validate({"device": {"name": "H100"}, "kernel_id": kernel, "source": source,
                                           "compiled": True, "time": ms, "speedup": 1.0, "max_diff": 0.0,
                                           "workload": workload, "status": "passed", "timing": timing})


def test_the_projection_sets_the_engines_clock_beside_the_replays_and_names_it_where_a_row_is_off():
    from rich.console import Console

    from fi_profile.replay.projection import KernelProjection, against_measurement, timed_clock_mhz
    from fi_profile.replay.report import print_measured
    from fi_profile.schema import Workload
    from fi_profile.schema.run_info import EngineKernels

    workloads = [Workload.model_validate({"uuid": u, "axes": {"M": m}, "inputs": {}, "count": c})
                 for u, m, c in (("small", 16, 30), ("large", 8192, 10))]
    results = [_result("gemm", "small", "torch", 0.08, 1980.0), _result("gemm", "large", "torch", 2.4, 1500.0),
               _result("gemm", "small", "triton", 0.07, 1200.0)]
    assert timed_clock_mhz(results, workloads, "torch") == pytest.approx((30 * 1980 + 10 * 1500) / 40)
    assert timed_clock_mhz(results[:1] + [_result("gemm", "large", "torch", 2.4, None)], workloads, "torch") == 1980.0
    assert timed_clock_mhz(results, workloads, "flashinfer") is None

    rows = [KernelProjection("attn", 100, "sglang_triton", 0.8, None, None, baseline_mhz=1975.0),
            KernelProjection("gemm", 100, "torch", 0.97, None, None, baseline_mhz=1900.0),
            KernelProjection("norm", 100, "torch", 0.01, None, None)]
    measured = EngineKernels.model_validate({
        "device": "cuda", "steps": 3, "total_ms": 200.0, "attributed_share": 1.0, "unattributed": [],
        "sm_clock_mhz": 1700.0, "clock_limited_share": 0.7,
        "by_definition": {"attn": {"ms": 100.0, "calls": 100, "kernels": ["_fwd_kernel"], "sm_clock_mhz": 1610.0},
                          "gemm": {"ms": 99.0, "calls": 100, "kernels": ["nvjet"], "sm_clock_mhz": 1790.0},
                          "norm": {"ms": 1.0, "calls": 100, "kernels": ["rms"]}}})
    found = {row.kernels: row for row in against_measurement(rows, measured)}
    assert found[("attn",)].engine_mhz == 1610.0 and found[("attn",)].replay_mhz == 1975.0
    assert found[("norm",)].engine_mhz is None and found[("norm",)].replay_mhz is None
    console = Console(record=True, width=250)
    print_measured(console, list(found.values()), 200.0, "cuda", frozenset({"cupti_kernels"}))
    text = console.export_text()
    assert "SM MHz eng/replay" in text and "1,610/1,975" in text and "-/-" in text
    # the attention row is off (0.80) and ran at a lower clock in the engine: named, with its ratio at the
    # engine's clock (80 ms x 1975 / 1610 = 98.1 ms of 100); the GEMM is within ±10%
    note = next(line for line in text.splitlines() if line.startswith("! of those"))
    assert "attn 1,610 against 1,975 MHz (× 0.98 at the engine's clock)" in note and "gemm" not in note
    attn = next(line for line in text.splitlines() if line.startswith("│ attn "))
    assert "0.80 !" in attn and "0.98" in attn
    # the total: (80 + 97 + 1) / 200 as replayed; (98.1 + 97 x 1900 / 1790 + 1) / 200 at the engine's clocks
    total = next(line for line in text.splitlines() if line.startswith("engine kernel time"))
    assert "(× 0.89, outside ±5%)" in total
    assert "× 1.01 with the replayed times scaled to the engine's SM clock where both clocks are known (2 of 3 rows)" \
        in total


def test_without_clocks_the_table_has_no_clock_column():
    from rich.console import Console

    from fi_profile.replay.projection import KernelProjection, against_measurement
    from fi_profile.replay.report import print_measured
    from fi_profile.schema.run_info import EngineKernels

    measured = EngineKernels.model_validate({
        "device": "cpu", "steps": 3, "total_ms": 2.0, "attributed_share": 1.0, "unattributed": [],
        "by_definition": {"gemm": {"ms": 2.0, "calls": 100, "kernels": ["aten::mm"]}}})
    console = Console(record=True, width=200)
    print_measured(console, against_measurement([KernelProjection("gemm", 100, "torch", 0.01, None, None)], measured),
                   2.0, "cpu")
    assert "SM MHz" not in console.export_text()


def test_the_summary_line_gives_the_clock_or_says_it_was_not_sampled():
    from fi_profile.capture.report import engine_kernel_line
    from fi_profile.schema.run_info import EngineKernels

    base = {"steps": 3, "total_ms": 10.0, "attributed_share": 1.0, "unattributed": [],
            "by_definition": {"gemm": {"ms": 10.0, "calls": 3, "kernels": ["nvjet"]}}}
    clocked = engine_kernel_line(EngineKernels.model_validate({**base, "device": "cuda", "sm_clock_mhz": 1712.4,
                                                              "clock_limited_share": 0.58}))
    assert "SM clock 1,712 MHz" in clocked and "held down for power or heat 58%" in clocked
    assert "not sampled (NVML did not answer)" in engine_kernel_line(EngineKernels.model_validate({**base, "device": "cuda"}))
    assert "SM clock" not in engine_kernel_line(EngineKernels.model_validate({**base, "device": "cpu"}))


def test_a_moe_row_off_under_dummy_weights_with_a_correction_bias_says_the_routing_collapsed():
    """SGLang, DeepSeek-V3 with dummy weights on an H200: the MoE projected at × 1.47 of its
    measurement, because the bias alone picked the same experts for every token while the replay's
    logits spread them. The note names such a row only for a bias-routed MoE in a dummy-weights
    capture."""
    from rich.console import Console

    from fi_profile.catalog import shipped_definition
    from fi_profile.replay.projection import KernelProjection, against_measurement
    from fi_profile.replay.report import bias_routed_dummy, print_measured
    from fi_profile.schema import KernelCallingRecord
    from fi_profile.schema.run_info import EngineKernels, RunInfo

    moe = shipped_definition("moe_bf16_ds_routing_topk8_ng8_kg4_e256_h7168_i2048_shared1")
    softmax = shipped_definition("moe_bf16_softmax_topk8_e64_h2048_i1024")
    definitions = {moe.name: moe, softmax.name: softmax}
    record = KernelCallingRecord.model_validate({"model": "m", "framework": "SGLang", "kernels": [],
                                                 "run": {"weights": "dummy (random)"}})
    assert bias_routed_dummy(record, definitions) == {moe.name}
    real = record.model_copy(update={"run": RunInfo(weights="auto")})
    assert bias_routed_dummy(real, definitions) == frozenset()
    zeroed = record.model_copy(update={"run": RunInfo(weights="dummy (random)", dummy_biases_zeroed=58)})
    assert bias_routed_dummy(zeroed, definitions) == frozenset()  # the capture spread the routing

    measured = EngineKernels.model_validate({
        "device": "cuda", "steps": 32, "total_ms": 72.6, "attributed_share": 1.0, "unattributed": [],
        "by_definition": {moe.name: {"ms": 27.229, "calls": 64, "kernels": ["fused_moe_kernel"]},
                          softmax.name: {"ms": 20.0, "calls": 64, "kernels": ["fused_moe_kernel"]}}})
    rows = against_measurement([KernelProjection(moe.name, 64, "sglang", 39.891 / 64, None, None),
                                KernelProjection(softmax.name, 64, "sglang", 30.0 / 64, None, None)], measured)

    def note(biased):
        console = Console(record=True, width=400)
        print_measured(console, rows, 72.6, "cuda", frozenset({"cupti_kernels"}), biased)
        return [line for line in console.export_text().splitlines() if "dummy weights" in line]

    assert len(note(bias_routed_dummy(record, definitions))) == 1
    assert moe.name in note(bias_routed_dummy(record, definitions))[0]
    assert softmax.name not in note(bias_routed_dummy(record, definitions))[0]
    assert note(bias_routed_dummy(real, definitions)) == []


def test_gpt_oss_moe_behind_a_router_with_a_bias_is_bias_routed_under_dummy_weights():
    """gpt-oss's router is a linear layer with a bias (``gemm_bias_bf16_n32_k2880``: its 32 experts
    from its hidden size 2880); under dummy weights that bias alone picks the experts, and the MoE
    rows were off by 1.47-2.02 on an H200 (2026-12-04). A bias GEMM of other sizes routes nothing,
    and a record without the router does not count."""
    from fi_profile.capture.definition_factory import definition_for
    from fi_profile.catalog import shipped_definition
    from fi_profile.replay.report import bias_routed_dummy
    from fi_profile.schema import KernelCallingRecord
    from fi_profile.schema.dtype import DType

    moe = shipped_definition("moe_bf16_renorm_topk4_e32_h2880_i2880_swigluoai_bias")
    router = definition_for("gemm_bias_bf16_n4096_k4096", "gemm_bias_bf16_n32_k2880", {"N": 32, "K": 2880}, DType.bfloat16)
    other = definition_for("gemm_bias_bf16_n4096_k4096", "gemm_bias_bf16_n5120_k2880", {"N": 5120, "K": 2880},
                           DType.bfloat16)
    definitions = {d.name: d for d in (moe, router, other)}

    def record(*ids):
        return KernelCallingRecord.model_validate({"model": "m", "framework": "vLLM", "run": {"weights": "dummy"},
                                                   "kernels": [{"id": i, "count": 1} for i in ids]})

    assert bias_routed_dummy(record(moe.name, router.name, other.name), definitions) == {moe.name}
    assert bias_routed_dummy(record(moe.name, other.name), definitions) == frozenset()
