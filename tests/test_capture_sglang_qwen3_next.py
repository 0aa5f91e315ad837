"""A hybrid model in SGLang 0.5.23 on CPU: the tiny Qwen3-Next of ``test_capture_qwen3_next`` (3
Gated DeltaNet layers with heads of 128, then one gated full attention layer), without its shared
expert: SGLang applies the shared expert's gate by a Triton kernel (``fused_gate_sigmoid_mul_add``)
unless the CPU has AMX and a CPU build of sgl-kernel, and neither is here. Its Gated DeltaNet
kernels are sgl-kernel's CPU ops, in PyTorch here (``tests/sglang_cpu/sgl_kernel_mamba.py``).

Each Gated DeltaNet layer (``RadixLinearAttention`` on SGLang's ``GDNAttnBackend``) is one
``causal_conv1d_*`` and one ``gdn_*`` call per step, of the step's kind, and its gated norm
(``FusedRMSNormGated``) one ``gated_rmsnorm_*`` call: the counts vLLM records for the same model.
The shared expert's gate, built and never called, is the only layer listed."""

from __future__ import annotations

import json

from test_capture_qwen3_next import CONV_DECODE, CONV_PREFILL, GDN_DECODE, GDN_LAYERS, GDN_PREFILL
from test_capture_sglang import SGLANG_PYTHON
from test_capture_vllm import MODELS, OUTPUT_LEN, capture, counts

ATTENTION_LAYERS = 1


def _model(tmp_path):
    config = json.loads((MODELS / "tiny-qwen3-next" / "config.json").read_text())
    model = tmp_path / "tiny-qwen3-next-routed"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**config, "shared_expert_intermediate_size": 0}))
    return str(model)


def test_sglangs_gated_deltanet_layers_are_a_conv1d_and_a_recurrence_per_layer_and_step(tmp_path):
    result = capture(tmp_path, "qwen3-next", python=SGLANG_PYTHON, framework="sglang", model=_model(tmp_path))
    run = result["record"]["run"]
    assert run["hook_errors"] == {} and run["hooks_missing"] == [], run
    # the shared expert's gate: SGLang builds it (an nn.Linear) with no shared expert to gate
    assert run["not_covered"] == {"Linear (a torch nn.Linear no hook records)": GDN_LAYERS + ATTENTION_LAYERS}
    found = counts(result)
    steps = found["embedding_v2048_h256"]
    decode_steps = OUTPUT_LEN - 1
    assert found[GDN_DECODE] == GDN_LAYERS * decode_steps
    assert found[GDN_PREFILL] == GDN_LAYERS * (steps - decode_steps)
    assert found[CONV_DECODE] == GDN_LAYERS * decode_steps
    assert found[CONV_PREFILL] == GDN_LAYERS * (steps - decode_steps)
    assert found["gated_rmsnorm_h128"] == GDN_LAYERS * steps
    # the full attention layer beside them, and its zero-centred q/k norms
    assert found["gqa_paged_decode_h4_kv2_d64_ps1"] == ATTENTION_LAYERS * decode_steps
    assert found["gemma_rmsnorm_h64"] == 2 * ATTENTION_LAYERS * steps
    # the layers' kernels (sgl-kernel's CPU ops here) are their calls'
    measured = run["engine_kernels"]
    assert measured["attributed_share"] >= 0.95, measured["unattributed"]
    assert all(measured["by_definition"][d]["ms"] > 0 for d in (GDN_DECODE, GDN_PREFILL, CONV_DECODE, CONV_PREFILL))

    out = result["out_dir"]
    prefill = json.loads((out / "workloads" / "gdn" / f"{GDN_PREFILL}.jsonl").read_text().splitlines()[0])["workload"]
    assert prefill["inputs"]["cu_seqlens"]["type"] == "safetensors"
    conv = json.loads((out / "workloads" / "causal_conv1d" / f"{CONV_PREFILL}.jsonl").read_text()
                      .splitlines()[0])["workload"]
    assert {n for n, v in conv["inputs"].items() if v["type"] == "safetensors"} == {
        "cu_seqlens", "conv_state_indices", "has_initial_state"}
