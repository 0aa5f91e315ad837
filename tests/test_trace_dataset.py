"""Every replay status becomes a Trace that flashinfer-bench's own model accepts."""

import json

import pytest
from flashinfer_bench.data import EvaluationStatus as FibStatus
from flashinfer_bench.data import Trace as FibTrace

from fi_profile.replay.trace_dataset import STATUS, trace_of
from fi_profile.schema import BenchmarkResult, Workload
from fi_profile.schema.benchmark_result import Status

WORKLOAD = Workload.model_validate({"uuid": "w0", "axes": {"M": 7}, "inputs": {"x": {"type": "random"}}, "count": 3})
CHECK = {"max_abs_diff": 0.5, "max_rel_diff": 0.25, "mismatch_ratio": 0.1, "atol": 1e-2, "rtol": 1e-2, "draws": 3}


def result(status: Status, **more) -> BenchmarkResult:
    passed = status is Status.passed
    fields = {"device": {"name": "NVIDIA H200"}, "kernel_id": "gemm_bf16_n64_k32", "source": "gemm_bf16_n64_k32__torch",
              "workload": "w0", "status": status.value, "compiled": status is not Status.compile_error,
              "libs": {"torch": "2.11.0"}}
    if passed:
        fields.update(time=0.02, speedup=1.5, max_diff=0.0, reference_time=0.03,
                      timing={"method": "cupti_kernels", "repetitions": 40, "median_ms": 0.02, "p10_ms": 0.019,
                              "p90_ms": 0.021, "cv": 0.02, "cold_l2": True, "stopped_by": "precision",
                              "median_rel_error": 0.004})
    if status is Status.compile_error:
        fields["compile_error"] = "nvcc: error"
    elif not passed:
        fields["error"] = f"it went {status.value}"
    fields.update(more)
    return BenchmarkResult.model_validate(fields)


@pytest.mark.parametrize("status", list(Status))
def test_each_status_is_a_trace_flashinfer_bench_reads(status):
    check = CHECK if status in (Status.passed, Status.incorrect_numerical, Status.stale_output) else None
    trace = trace_of(result(status, **({"check": check} if check else {})), WORKLOAD)
    theirs = FibTrace.model_validate(json.loads(trace.model_dump_json(exclude_none=True)))
    assert theirs.solution == "gemm_bf16_n64_k32__torch" and theirs.workload.uuid == "w0"
    assert theirs.evaluation.environment.hardware == "NVIDIA_H200"
    expected = STATUS[status].value if check is not None or STATUS[status].value not in ("PASSED", "INCORRECT_NUMERICAL") \
        else "RUNTIME_ERROR"  # flashinfer-bench needs the errors there: none was measured
    assert theirs.evaluation.status == FibStatus(expected)
    if status is Status.passed:
        performance = theirs.evaluation.performance
        assert (performance.latency_ms, performance.reference_latency_ms, performance.speedup_factor) == (0.02, 0.03, 1.5)
        assert theirs.evaluation.correctness.max_relative_error == 0.25
        assert "cupti_kernels" in theirs.evaluation.log
    elif theirs.evaluation.status.value != status.name.upper():
        assert f"fi-profile status: {status.value}" in theirs.evaluation.log  # the kind of failure is kept
