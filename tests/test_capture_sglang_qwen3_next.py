"""A hybrid model in SGLang 0.5.23 on CPU: the tiny Qwen3-Next of ``test_capture_qwen3_next`` (3
Gated DeltaNet layers with heads of 128, then one gated full attention layer; 8 experts top-2 and a
gated shared expert). Its Gated DeltaNet kernels are sgl-kernel's CPU ops and two Triton launches
SGLang makes on CPU too (the gated norm, the shared expert's gate) are computed in PyTorch here
(``tests/sglang_cpu/``): SGLang's calls to them are its own.

Each Gated DeltaNet layer (``RadixLinearAttention`` on SGLang's ``GDNAttnBackend``) is one
``causal_conv1d_*`` and one ``gdn_*`` call per step, of the step's kind, and its gated norm
(``FusedRMSNormGated``) one ``gated_rmsnorm_*`` call: the counts vLLM records for the same model.
The shared expert's gate, its sigmoid, product and add are one ``shared_expert_gate_*`` call per
layer and step (SGLang's ``fused_gate_sigmoid_mul_add``). The record is complete."""

from __future__ import annotations

import json

from test_capture_qwen3_next import CONV_DECODE, CONV_PREFILL, GDN_DECODE, GDN_LAYERS, GDN_PREFILL
from test_capture_sglang import SGLANG_PYTHON, complete_capture
from test_capture_vllm import MODELS, OUTPUT_LEN, capture, counts, replays_on_cpu
from typer.testing import CliRunner

ATTENTION_LAYERS = 1


def test_sglangs_gated_deltanet_layers_are_a_conv1d_and_a_recurrence_per_layer_and_step(tmp_path):
    result, run, found = complete_capture(tmp_path, "qwen3-next", str(MODELS / "tiny-qwen3-next"))
    steps = found["embedding_v2048_h256"]
    decode_steps = OUTPUT_LEN - 1
    assert found[GDN_DECODE] == GDN_LAYERS * decode_steps
    assert found[GDN_PREFILL] == GDN_LAYERS * (steps - decode_steps)
    assert found[CONV_DECODE] == GDN_LAYERS * decode_steps
    assert found[CONV_PREFILL] == GDN_LAYERS * (steps - decode_steps)
    assert found["gated_rmsnorm_h128"] == GDN_LAYERS * steps
    # every layer's experts, and its shared expert's gate in one kernel with the sigmoid, product and add
    assert found["moe_bf16_renorm_topk2_e8_h256_i128"] == (GDN_LAYERS + ATTENTION_LAYERS) * steps
    assert found["shared_expert_gate_sigmoid_mul_add_h256"] == (GDN_LAYERS + ATTENTION_LAYERS) * steps
    # the full attention layer beside them, and its zero-centred q/k norms
    assert found["gqa_paged_decode_h4_kv2_d64_ps1"] == ATTENTION_LAYERS * decode_steps
    assert found["gemma_rmsnorm_h64"] == 2 * ATTENTION_LAYERS * steps
    # the gated attention's output gate: its sigmoid and product, one call per layer and step
    assert found["sigmoid_gate_mul_h256"] == ATTENTION_LAYERS * steps
    # the layers' kernels (sgl-kernel's CPU ops here) are their calls', and each layer's own work
    # between its hooked calls (a Gated DeltaNet layer's split and concatenation of its projections,
    # the attention layer's query and gate split) its core call's: 97.2% attributed without that
    measured = run["engine_kernels"]
    assert measured["attributed_share"] >= 0.99, measured["unattributed"]
    assert not {"aten::cat", "aten::split_with_sizes", "aten::chunk"} & {u["name"] for u in measured["unattributed"]}
    assert all(measured["by_definition"][d]["ms"] > 0 for d in (GDN_DECODE, GDN_PREFILL, CONV_DECODE, CONV_PREFILL,
                                                                 "sigmoid_gate_mul_h256"))

    out = result["out_dir"]
    prefill = json.loads((out / "workloads" / "gdn" / f"{GDN_PREFILL}.jsonl").read_text().splitlines()[0])["workload"]
    assert prefill["inputs"]["cu_seqlens"]["type"] == "safetensors"
    conv = json.loads((out / "workloads" / "causal_conv1d" / f"{CONV_PREFILL}.jsonl").read_text()
                      .splitlines()[0])["workload"]
    assert {n for n, v in conv["inputs"].items() if v["type"] == "safetensors"} == {
        "cu_seqlens", "conv_state_indices", "has_initial_state"}

    replays_on_cpu(out, [GDN_DECODE, GDN_PREFILL, CONV_DECODE, CONV_PREFILL, "shared_expert_gate_sigmoid_mul_add_h256"],
                   tmp_path / "r")


def test_under_tensor_parallelism_each_rank_records_its_heads_and_channels(tmp_path):
    """TP=2: each rank's Gated DeltaNet has 1 key and 2 value heads (flashinfer-trace names the
    dataset's calls by the heads per rank), its conv1d half the channels."""
    _, _, found = complete_capture(tmp_path, "qwen3-next-tp2", str(MODELS / "tiny-qwen3-next"), tp=2)
    ranks, decode_steps = 2, OUTPUT_LEN - 1
    assert found["gdn_decode_qk1_v2_d128_k_last"] == ranks * GDN_LAYERS * decode_steps
    assert found["causal_conv1d_decode_c512_w4_silu"] == ranks * GDN_LAYERS * decode_steps
    assert found["gdn_prefill_qk1_v2_d128_k_last"] == found["causal_conv1d_prefill_c512_w4_silu"] > 0
    assert not any(k.startswith(("gdn_decode_qk2", "causal_conv1d_decode_c1024")) for k in found)


FUSED_MOE = "moe_bf16_renorm_topk2_e8_h256_i128_shared1_sigmoid_gate"


def test_a_shared_expert_fused_into_the_experts_is_one_moe_call_with_its_gate(tmp_path):
    """SGLang's default for Qwen3-Next on CUDA: the block appends its shared expert to each token's
    top-k as a 9th expert, weighted by the sigmoid of its gate's logit (the gate's linear layer, the
    sigmoid, the append kernel), and the experts run 9 experts' weights. Built so here (the block as
    on CUDA, the append kernel in PyTorch: ``tests/sglang_cpu/cpu_paths.py``): each layer and step is
    one ``..._shared1_sigmoid_gate`` MoE call taking the gate's logits, after the gate's GEMM call,
    no separate shared expert, nothing listed; the MoE's reference and PyTorch baseline agree on its
    workloads."""
    result = capture(tmp_path, "qwen3-next-fused", python=SGLANG_PYTHON, framework="sglang",
                     model=str(MODELS / "tiny-qwen3-next"), env={"FI_PROFILE_TEST_FUSE_SHARED_EXPERT": "1"})
    run = result["record"]["run"]
    assert run["hook_errors"] == {} and run["hooks_missing"] == [] and not run["not_covered"], run
    assert not run.get("incomplete"), run
    found = counts(result)
    steps = found["embedding_v2048_h256"]
    assert found[FUSED_MOE] == (GDN_LAYERS + ATTENTION_LAYERS) * steps
    assert "moe_bf16_renorm_topk2_e8_h256_i128" not in found
    assert not any(k.startswith("shared_expert_gate") for k in found)
    # the gate's linear layer is a GEMM call (its logits the MoE call's input), one per layer and step
    assert found["gemm_bf16_n1_k256"] == (GDN_LAYERS + ATTENTION_LAYERS) * steps
    assert run["engine_kernels"]["attributed_share"] >= 0.95, run["engine_kernels"]["unattributed"]

    from fi_profile.cli import app

    out = result["out_dir"]
    definition = json.loads((out / "definitions" / "moe" / f"{FUSED_MOE}.json").read_text())
    assert definition["inputs"]["shared_gate_logits"]["shape"] == ["seq_len", "num_shared_experts"]
    assert definition["axes"]["num_weight_experts"]["value"] == 9
    replayed = CliRunner().invoke(app, ["replay", str(out), "--definitions", FUSED_MOE, "--device", "cpu",
                                        "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["source"].rsplit("__", 1)[-1] for r in results} >= {"reference", "torch"}
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]
