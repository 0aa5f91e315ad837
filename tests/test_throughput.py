"""Achieved TFLOP/s beside each replay time: the families' FLOP counts, the cards' dense peaks per
precision, and the per-Definition table that prints them."""

import pytest
import torch
from rich.console import Console

from fi_profile.catalog import shipped_definition
from fi_profile.families import fp8_linear, moe
from fi_profile.replay.report import print_results
from fi_profile.replay.throughput import peak, precision, tflops
from fi_profile.schema import BenchmarkResult, Definition


def test_flop_counts_of_gemms_batched_gemms_and_moe_layers():
    """2 M N K per GEMM (FP8 ones too), times the batch of a batched GEMM; a MoE layer's every token
    runs its top-k experts and its fused shared ones (two GEMMs of 2I x H and H x I each). None for
    work no FLOP count describes (a quantization kernel) and for an expert-parallel MoE."""
    gemm = shipped_definition("gemm_bf16_n4096_k4096")
    assert tflops(gemm, {"M": 10}, 0.01) == pytest.approx(2 * 10 * 4096 * 4096 / 1e-5 / 1e12)
    bmm = shipped_definition("bmm_bf16_b128_n512_k128")
    assert tflops(bmm, {"M": 4}, 1.0) == pytest.approx(2 * 128 * 4 * 512 * 128 / 1e-3 / 1e12)
    assert tflops(shipped_definition("gemm_fp8_per_tensor_scale_n4096_k4096"), {"M": 1}, 1.0) == pytest.approx(
        2 * 4096 * 4096 / 1e-3 / 1e12)
    assert tflops(shipped_definition("quant_fp8_per_token_k4096"), {"M": 8}, 1.0) is None
    shared = shipped_definition("moe_bf16_ds_routing_topk8_ng8_kg4_e256_h7168_i2048_shared1")
    assert tflops(shared, {"seq_len": 3}, 1.0) == pytest.approx(2 * 3 * 9 * 3 * 7168 * 2048 / 1e-3 / 1e12)
    routed = moe.call(torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(1, 8), num_experts=8, top_k=2,
                      intermediate_size=32, renormalize=True).definition
    assert tflops(routed, {"seq_len": 5}, 1.0) == pytest.approx(2 * 5 * 2 * 3 * 64 * 32 / 1e-3 / 1e12)
    whole = shipped_definition("moe_bf16_ds_routing_topk8_ng8_kg4_e256_h7168_i2048")
    local = Definition.model_validate({**whole.to_dict(), "axes": {**whole.to_dict()["axes"],
                                                                   "num_local_experts": {"type": "const", "value": 32}}})
    assert tflops(whole, {"seq_len": 1}, 1.0) and tflops(local, {"seq_len": 1}, 1.0) is None  # EP: routing decides


def test_peaks_are_the_cards_dense_figures_for_the_operands_precision():
    fp8 = fp8_linear.scaled_gemm_call(1, 256, 256, "token", "channel", torch.bfloat16).definition
    bf16 = shipped_definition("gemm_bf16_n4096_k4096")
    assert precision(fp8) == "fp8" and precision(bf16) == "bf16"
    assert peak("NVIDIA H100 80GB HBM3", fp8) == 1979.0 and peak("NVIDIA H100 80GB HBM3", bf16) == 989.5
    assert peak("NVIDIA H100 PCIe", bf16) == 756.5 and peak("NVIDIA H200", fp8) == 1979.0
    assert peak("NVIDIA H200 NVL", bf16) == 835.5
    assert peak("NVIDIA A100-SXM4-80GB", fp8) is None  # no FP8 tensor cores
    assert peak("cpu", bf16) is None and peak("NVIDIA L4", bf16) is None  # not listed: no share printed
    float32_out = shipped_definition("gemm_bf16_n256_k7168_out_fp32")
    assert precision(float32_out) == "bf16"  # the operands decide, not the result


def test_the_results_table_prints_tflops_and_the_share_of_the_peak():
    """A GEMM's row gets its median TFLOP/s over the workloads and, on a listed card, its share of
    the peak; a Definition without a FLOP count gets neither, and a CPU's table has no such columns
    (its rate says little, and an 80-column terminal keeps the table's other headers whole)."""
    def result(kernel, workload, ms, device="NVIDIA H100 80GB HBM3"):
        return BenchmarkResult.model_validate({
            "device": {"name": device}, "kernel_id": kernel, "source": f"{kernel}__torch", "time": ms,
            "speedup": 1.0, "workload": workload, "status": "passed", "definition_op_type": "gemm", "compiled": True,
            "max_diff": 0.0})

    gemm = shipped_definition("gemm_bf16_n4096_k4096")
    norm = shipped_definition("rmsnorm_h4096")
    axes = {"w1": {"M": 1000}, "w2": {"M": 2000}, "w3": {"M": 8}}
    results = [result(gemm.name, "w1", 0.05), result(gemm.name, "w2", 0.1), result(norm.name, "w3", 0.01)]
    console = Console(record=True, width=250)
    print_results(console, results, {d.name: d for d in (gemm, norm)}, axes)
    text = console.export_text()
    rate = 2 * 1000 * 4096 * 4096 / 0.05e-3 / 1e12  # both GEMM workloads run at this rate
    gemm_row, norm_row = (line for line in text.splitlines() if line.startswith("│ torch"))
    assert f"{rate:.1f}" in gemm_row and f"{100 * rate / 989.5:.0f}%" in gemm_row
    assert "0.0100" in norm_row and "%" not in norm_row and "." not in norm_row.replace("0.0100", "").replace("1.00", "")
    assert text.count("TFLOP/s") == 1  # the norm's table has no throughput columns
    cpu = Console(record=True, width=80)
    print_results(cpu, [result(gemm.name, "w1", 0.05, device="cpu")], {gemm.name: gemm}, axes)
    printed = cpu.export_text()
    assert "TFLOP/s" not in printed and "× ref" in printed
