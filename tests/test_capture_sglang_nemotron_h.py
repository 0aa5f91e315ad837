"""A Mamba-2 hybrid in SGLang 0.5.23 on CPU: the tiny Nemotron-H of ``test_capture_nemotron_h``
(``M-M*``: two Mamba-2 mixers, one MLP with the squared ReLU, one attention layer). SGLang binds no
conv1d for the mixer on CPU and launches Triton for its scan and state update: those four are
computed in PyTorch here (``tests/sglang_cpu/``); SGLang's calls to them are its own.

Each mixer (``MambaMixer2`` on SGLang's ``Mamba2AttnBackend``) is one ``causal_conv1d_*_bias``
and one ``mamba_ssd_prefill_*`` or ``mamba_ssu_decode_*`` call per step, of the step's kind, and
its gated norm (``Mixer2RMSNormGated``) one ``gated_rmsnorm_gate_first_*`` call: the counts vLLM
records for the same model. The record is complete, and its workloads replay.

SGLang's Nemotron-H config reads the mixer's groups from ``mamba_n_groups`` (default 8) and the
state cache's from ``n_groups``: the fixture sets both, as Nemotron-H's checkpoints agree on them."""

from __future__ import annotations

import json

from test_capture_nemotron_h import ATTENTION_LAYERS, CONV_DECODE, CONV_PREFILL, MAMBA_LAYERS, MLP_LAYERS, NORM, SSD, SSU
from test_capture_sglang import SGLANG_PYTHON, complete_capture
from test_capture_vllm import MODELS, OUTPUT_LEN, capture, counts, replays_on_cpu


def test_sglangs_mamba2_mixers_are_a_conv1d_and_a_recurrence_per_layer_and_step(tmp_path):
    result, run, found = complete_capture(tmp_path, "nemotron-h", str(MODELS / "tiny-nemotron-h"))
    steps = found["embedding_v2048_h256"]
    decode_steps = OUTPUT_LEN - 1
    assert found[SSU] == found[CONV_DECODE] == MAMBA_LAYERS * decode_steps, found
    assert found[SSD] == found[CONV_PREFILL] == MAMBA_LAYERS * (steps - decode_steps), found
    assert found[NORM] == MAMBA_LAYERS * steps
    assert found["relu2_i512"] == MLP_LAYERS * steps
    # the mixers' projections: in_proj (gate, x, B and C of 2 groups, dt per head), out_proj
    assert found["gemm_bf16_n1544_k256"] == found["gemm_bf16_n256_k512"] - MLP_LAYERS * steps == MAMBA_LAYERS * steps
    assert found["gqa_paged_decode_h4_kv2_d64_ps1"] == ATTENTION_LAYERS * decode_steps
    # the mixers' kernels (PyTorch's here) are their calls', their conv1d's and recurrence's
    measured = run["engine_kernels"]
    assert measured["attributed_share"] >= 0.95, measured["unattributed"]
    assert all(measured["by_definition"][d]["ms"] > 0 for d in (SSU, SSD, CONV_DECODE, CONV_PREFILL, NORM))

    out = result["out_dir"]
    prefill = json.loads((out / "workloads" / "mamba_ssd" / f"{SSD}.jsonl").read_text().splitlines()[0])["workload"]
    assert {n for n, v in prefill["inputs"].items() if v["type"] == "safetensors"} >= {
        "cu_seqlens", "state_indices", "has_initial_state"}

    replays_on_cpu(out, [SSU, SSD, CONV_DECODE, CONV_PREFILL, NORM], tmp_path / "r")


def test_under_tensor_parallelism_each_rank_records_its_heads_groups_and_channels(tmp_path):
    """TP=2: each rank's mixer has 4 of the 8 heads and 1 of the 2 groups, its conv1d half the
    channels (256 of x, 128 each of B and C), its gated norm half the row in one group."""
    _, _, found = complete_capture(tmp_path, "nemotron-h-tp2", str(MODELS / "tiny-nemotron-h"), tp=2)
    ranks, decode_steps = 2, OUTPUT_LEN - 1
    assert found["mamba_ssu_decode_h4_d64_s128_ng1_state_float32"] == ranks * MAMBA_LAYERS * decode_steps, found
    assert found["causal_conv1d_decode_c512_w4_silu_bias"] == ranks * MAMBA_LAYERS * decode_steps
    assert found["mamba_ssd_prefill_h4_d64_s128_ng1_state_float32"] == found["causal_conv1d_prefill_c512_w4_silu_bias"] > 0
    assert found["gated_rmsnorm_gate_first_h256_gs256"] > 0
    assert not any(k.startswith(("mamba_ssu_decode_h8", "causal_conv1d_decode_c1024")) for k in found)


def test_a_granite4_hybrids_mixers_are_recorded_and_its_multipliers_listed_by_name(tmp_path):
    """Granite-4.0-H (``GraniteMoeHybrid``: 3 Mamba-2 mixers of 12 heads in one group, one attention
    layer, a MoE in every layer) in SGLang: each mixer is a conv1d and a recurrence per step, its
    gated norm over the whole row (one group); the muP multipliers the layers apply in their own
    code are listed by name, so the record says it is incomplete."""
    result = capture(tmp_path, "granite4", python=SGLANG_PYTHON, framework="sglang",
                     model=str(MODELS / "tiny-granite4-hybrid"))
    run = result["record"]["run"]
    assert run["hook_errors"] == {} and run["hooks_missing"] == [], run
    listed = " ".join(run["not_covered"])
    assert "residual_multiplier" in listed and "embedding_multiplier" in listed and "MambaMixer2" not in listed
    assert "incomplete" in run
    found = counts(result)
    steps, decode_steps, mixers = found["embedding_v2048_h384"], OUTPUT_LEN - 1, 3
    assert found["mamba_ssu_decode_h12_d64_s128_ng1_state_float32"] == mixers * decode_steps
    assert found["causal_conv1d_decode_c1024_w4_silu_bias"] == mixers * decode_steps
    assert found["mamba_ssd_prefill_h12_d64_s128_ng1_state_float32"] == mixers * (steps - decode_steps)
    assert found["gated_rmsnorm_gate_first_h768_gs768"] == mixers * steps
