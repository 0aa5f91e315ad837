"""MLA (DeepSeek-V2/V3) Definitions on CPU: the shipped references against independent
computations (SDPA), the absorbed decode against the up-projected form it stands for, the
latent-cache write, and how a step's layout becomes MLA calls."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.paged_layout import paged_batches
from fi_profile.catalog import shipped_definition
from fi_profile.entry_points import run_reference
from fi_profile.families import mla
from fi_profile.schema.dtype import DType
from fi_profile.synthesis import synthesize_inputs

BF16 = dict(atol=1e-2, rtol=1.6e-2)


def reference(name, axes, seed=0, definition=None, **given):
    definition = definition or shipped_definition(name)
    inputs = synthesize_inputs(definition, axes, seed=seed, given=given)
    return inputs, run_reference(definition, inputs)


def sdpa_with_lse(q, k, v, sm_scale, causal_offset=None):
    """[tokens, heads, d] queries against [kv, kv_heads, d] keys: SDPA in float64, log2 LSE;
    ``causal_offset``: the KV tokens before the first query (bottom-right causal), None: no mask."""
    n_q, n_kv = q.shape[0], k.shape[0]
    mask = torch.ones(n_q, n_kv, dtype=torch.bool)
    if causal_offset is not None:
        mask = torch.arange(n_kv)[None, :] <= torch.arange(n_q)[:, None] + causal_offset
    qh, kh, vh = (t.double().transpose(0, 1) for t in (q, k, v))
    kh = kh.expand(qh.shape[0], -1, -1)
    vh = vh.expand(qh.shape[0], -1, -1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=sm_scale)
    scores = (qh @ kh.transpose(-1, -2)) * sm_scale
    lse2 = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1) / math.log(2)
    return out.transpose(0, 1), lse2.transpose(0, 1)


def latent(inputs, b, page_size):
    """Request ``b``'s latent (ckv) and rotary (kpe) cache rows, in order."""
    indptr = inputs["kv_indptr"]
    pages = inputs["kv_indices"][indptr[b] : indptr[b + 1]].long()
    last = int(inputs["kv_last_page_len"][b]) if "kv_last_page_len" in inputs else page_size
    n = (len(pages) - 1) * page_size + last
    ckv = inputs["ckv_cache"][pages].reshape(-1, inputs["ckv_cache"].shape[-1])[:n]
    kpe = inputs["kpe_cache"][pages].reshape(-1, inputs["kpe_cache"].shape[-1])[:n]
    return ckv, kpe


@pytest.mark.parametrize("page_size", [1, 64])
def test_paged_decode_is_multi_query_attention_on_the_latent_cache(page_size):
    """Absorbed decode: every head's query [q_nope, q_pe] against the one shared key [ckv, kpe],
    the latent rows as values."""
    name = f"mla_paged_decode_h16_ckv512_kpe64_ps{page_size}"
    inputs, out = reference(name, {"batch_size": 3, "len_indptr": 4, "num_kv_indices": 9, "num_pages": 20})
    for b in range(3):
        ckv, kpe = latent(inputs, b, page_size)
        q = torch.cat([inputs["q_nope"][b : b + 1], inputs["q_pe"][b : b + 1]], dim=-1)
        expected, lse = sdpa_with_lse(q, torch.cat([ckv, kpe], -1)[:, None], ckv[:, None], inputs["sm_scale"])
        torch.testing.assert_close(out["output"][b : b + 1], expected.to(torch.bfloat16), **BF16)
        torch.testing.assert_close(out["lse"][b : b + 1], lse.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("page_size", [1, 64])
def test_paged_prefill_is_causal_on_the_latent_cache(page_size):
    name = f"mla_paged_prefill_causal_h16_ckv512_kpe64_ps{page_size}"
    axes = {"len_indptr": 3, "total_q": 7, "num_kv_indices": 10 if page_size == 1 else 4, "num_pages": 30}
    if page_size > 1:
        axes["batch_size"] = 2
    inputs, out = reference(name, axes)
    qo = inputs["qo_indptr"]
    for b in range(2):
        ckv, kpe = latent(inputs, b, page_size)
        rows = slice(int(qo[b]), int(qo[b + 1]))
        q = torch.cat([inputs["q_nope"][rows], inputs["q_pe"][rows]], dim=-1)
        expected, lse = sdpa_with_lse(q, torch.cat([ckv, kpe], -1)[:, None], ckv[:, None], inputs["sm_scale"],
                                      causal_offset=ckv.shape[0] - q.shape[0])
        torch.testing.assert_close(out["output"][rows], expected.to(torch.bfloat16), **BF16)


def test_ragged_prefill_has_its_own_value_width():
    inputs, out = reference("mla_ragged_prefill_causal_h16_qk192_vo128", {"len_indptr": 3, "total_q": 9, "total_kv": 9})
    assert out["output"].shape == (9, 16, 128)
    qo, kv = inputs["qo_indptr"], inputs["kv_indptr"]
    for b in range(2):
        rows, cols = slice(int(qo[b]), int(qo[b + 1])), slice(int(kv[b]), int(kv[b + 1]))
        expected, lse = sdpa_with_lse(inputs["q"][rows], inputs["k"][cols], inputs["v"][cols], inputs["sm_scale"],
                                      causal_offset=(cols.stop - cols.start) - (rows.stop - rows.start))
        torch.testing.assert_close(out["output"][rows], expected.to(torch.bfloat16), **BF16)
        torch.testing.assert_close(out["lse"][rows], lse.float(), atol=1e-3, rtol=1e-3)


def test_absorbed_decode_computes_the_up_projected_attention():
    """What the engines' decode runs (W_UK batched GEMM, latent decode, W_UV batched GEMM; the
    Definitions at a small shape) equals attention with every head's keys and values up-projected
    from the latents (what the prefill's ragged Definition computes)."""
    heads, nope, rope, lora, v_dim, page_size = 4, 32, 16, 64, 24, 4
    torch.manual_seed(0)
    bmm_uk = definition_for("bmm_bf16_b128_n512_k128", f"bmm_bf16_b{heads}_n{lora}_k{nope}",
                            {"batch": heads, "N": lora, "K": nope}, DType.bfloat16)
    bmm_uv = definition_for("bmm_bf16_b128_n512_k128", f"bmm_bf16_b{heads}_n{v_dim}_k{lora}",
                            {"batch": heads, "N": v_dim, "K": lora}, DType.bfloat16)
    decode = definition_for("mla_paged_decode_h16_ckv512_kpe64_ps64", "mla_test_decode",
                            {"num_qo_heads": heads, "head_dim_ckv": lora, "head_dim_kpe": rope, "page_size": page_size},
                            DType.bfloat16)
    kv_len = 7
    ckv = torch.randn(kv_len, lora)
    kpe = torch.randn(kv_len, rope)
    w_uk = torch.randn(heads, nope, lora) / math.sqrt(lora)  # k_nope[h] = ckv @ w_uk[h].T
    w_uv = torch.randn(heads, lora, v_dim) / math.sqrt(lora)  # v[h] = ckv @ w_uv[h]
    q_nope, q_pe = torch.randn(1, heads, nope), torch.randn(1, heads, rope)
    sm_scale = 1 / math.sqrt(nope + rope)

    bf = lambda t: t.to(torch.bfloat16)  # noqa: E731
    absorbed = run_reference(bmm_uk, {"A": bf(q_nope.transpose(0, 1)), "B": bf(w_uk)})["C"].transpose(0, 1)
    pages = torch.zeros(2, page_size, lora), torch.zeros(2, page_size, rope)
    pages[0].view(-1, lora)[:kv_len], pages[1].view(-1, rope)[:kv_len] = ckv, kpe
    attended = run_reference(decode, {
        "q_nope": absorbed, "q_pe": bf(q_pe), "ckv_cache": bf(pages[0]), "kpe_cache": bf(pages[1]),
        "kv_indptr": torch.tensor([0, 2], dtype=torch.int32), "kv_indices": torch.tensor([0, 1], dtype=torch.int32),
        "kv_last_page_len": torch.tensor([kv_len - page_size], dtype=torch.int32), "sm_scale": sm_scale,
    })["output"]
    out = run_reference(bmm_uv, {"A": attended.transpose(0, 1), "B": bf(w_uv)})["C"].transpose(0, 1)

    ckv_b, kpe_b = bf(ckv).double(), bf(kpe).double()
    k = torch.cat([torch.einsum("tl,hnl->thn", ckv_b, bf(w_uk).double()), kpe_b[:, None].expand(-1, heads, -1)], -1)
    v = torch.einsum("tl,hlv->thv", ckv_b, bf(w_uv).double())
    expected, _ = sdpa_with_lse(torch.cat([bf(q_nope), bf(q_pe)], -1), k, v, sm_scale)
    torch.testing.assert_close(out.double(), expected, atol=3e-2, rtol=3e-2)


def test_latent_cache_write_stores_each_token_at_its_slot_and_skips_padding():
    name = "mla_kv_cache_write_ckv512_kpe64_ps64"
    slots = torch.tensor([5, 64 * 2 + 3, -1], dtype=torch.int64)
    inputs, out = reference(name, {"num_tokens": 3, "num_pages": 4}, slot_mapping=slots)
    flat_ckv = out["ckv_cache_out"].view(-1, 512)
    flat_kpe = out["kpe_cache_out"].view(-1, 64)
    torch.testing.assert_close(flat_ckv[5], inputs["ckv"][0])
    torch.testing.assert_close(flat_kpe[131], inputs["kpe"][1])
    untouched = torch.ones(4 * 64, dtype=torch.bool)
    untouched[[5, 131]] = False
    torch.testing.assert_close(flat_ckv[untouched], inputs["ckv_cache"].view(-1, 512)[untouched])


def step(q_lens, seq_lens, page_size=4, decode_max_query=1):
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    block_table = torch.arange(len(q_lens) * 8, dtype=torch.int32).view(len(q_lens), 8)
    return paged_batches(qsl, torch.tensor(seq_lens), block_table, page_size, decode_max_query)


SHAPE = mla.MlaShape(num_heads=4, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
                     dtype=DType.bfloat16, sm_scale=0.125)


def test_a_step_becomes_ragged_prefill_then_absorbed_decode_between_its_batched_gemms():
    decode, prefill = step([1, 1, 6], [9, 3, 6])
    calls = mla.layer_calls(decode, prefill, SHAPE, 4, 100)
    assert [c.definition.name for c in calls] == [
        "mla_ragged_prefill_causal_h4_qk128_vo64", "bmm_bf16_b4_n512_k64", "mla_paged_decode_h4_ckv512_kpe64_ps4",
        "bmm_bf16_b4_n64_k512"]
    assert calls[0].axes == {"len_indptr": 2, "total_q": 6, "total_kv": 6}
    assert calls[1].axes == calls[3].axes == {"M": 2}
    assert calls[2].axes == {"len_indptr": 3, "batch_size": 2, "num_kv_indices": 3 + 1, "num_pages": 100}
    assert mla.context_tokens(prefill, 4) == 0


def test_short_queries_a_backend_runs_as_decodes_are_the_absorbed_paged_prefill():
    """A backend whose decode threshold is above 1 (speculative tokens) runs them absorbed against
    the cache: not the one-query decode Definition."""
    decode, prefill = step([1, 3, 8], [9, 12, 8], decode_max_query=4)
    assert prefill.batch_size == 1 and decode.batch_size == 2
    names = [c.definition.name for c in mla.layer_calls(decode, prefill, SHAPE, 4, 100)]
    assert "mla_paged_prefill_causal_h4_ckv512_kpe64_ps4" in names and not any("decode" in n for n in names)


def test_a_prefill_with_cached_context_is_measured():
    """A prompt's later chunk (chunked prefill) or a prefix-cache hit attends to cached tokens:
    the ragged Definition does not cover those, and the hook says so (``context_tokens``)."""
    _, prefill = step([5, 6], [12, 6])
    assert mla.context_tokens(prefill, 4) == 7


def test_mla_layers_the_definitions_do_not_compute_are_named():
    from fi_profile.hooks.vllm import mla as vllm_mla

    MLAAttention = type("MLAAttention", (), {})
    plain = MLAAttention()
    plain.kv_cache_dtype, plain.impl = "auto", SimpleNamespace(is_sparse=False, dcp_world_size=1)
    assert vllm_mla.layer_problem(plain) is None
    fp8 = MLAAttention()
    fp8.kv_cache_dtype, fp8.impl = "fp8", SimpleNamespace(is_sparse=True, dcp_world_size=1)
    assert vllm_mla.layer_problem(fp8) == ("MLAAttention with KV cache fp8 on SimpleNamespace, sparse attention (an "
                                           "indexer's top-k tokens) (no Definition computes it)")
    other = type("SparseMLAAttention", (), {})()
    assert vllm_mla.layer_problem(other) == "SparseMLAAttention (an attention layer class no Definition computes)"
    wrapper = SimpleNamespace(fuse_qkv_rmsnorm=True, indexer=None)
    assert "fused q/kv RMSNorm" in vllm_mla.wrapper_problem(wrapper)


def test_deepseeks_fused_down_projection_is_recorded_where_vllm_runs_its_own_gemm():
    """On Hopper a bf16 ``DeepSeekV2FusedQkvAProjLinear`` runs vLLM's own GEMM past its linear
    method: its hook records it there (N = q_lora 1536 + kv_lora 512 + rope 64), and nothing where
    the method's hooked ``apply`` runs instead."""
    from fi_profile.hooks.vllm.hook_points import _fused_qkv_a_proj

    layer = SimpleNamespace(_use_min_latency_gemm=True, output_size_per_partition=2112, input_size_per_partition=7168)
    [call] = _fused_qkv_a_proj(layer, torch.zeros(5, 7168, dtype=torch.bfloat16))
    assert call.definition.name == "gemm_bf16_n2112_k7168" and call.axes == {"M": 5}
    layer._use_min_latency_gemm = False
    assert _fused_qkv_a_proj(layer, torch.zeros(5, 7168, dtype=torch.bfloat16)) == []


def test_sglangs_fused_a_gemm_function_is_one_gemm_of_the_layers_declared_size():
    """SGLang's DeepSeek attention hands its bf16 down-projection to ``linear_with_fused_a_gemm``:
    up to 16 tokens its own GEMM past the linear method (a silent gap on Hopper before: the first
    GPU run recorded the projection in the prefill step only), else the layer, whose method's hooked
    ``apply`` runs nested. One GEMM either way, sized from the layer's declared sizes; LoRA is refused."""

    from fi_profile.hooks.sglang.hook_points import POINTS, _fused_a_gemm

    layer = SimpleNamespace(output_size_per_partition=2112, input_size_per_partition=7168)
    [call] = _fused_a_gemm(layer, torch.zeros(3, 7168, dtype=torch.bfloat16))
    assert call.definition.name == "gemm_bf16_n2112_k7168" and call.axes == {"M": 3}
    layer.set_lora = True
    with pytest.raises(NotImplementedError, match="LoRA"):
        _fused_a_gemm(layer, torch.zeros(3, 7168, dtype=torch.bfloat16))
    [point] = [p for p in POINTS if p.methods == ("linear_with_fused_a_gemm",)]
    assert "gemm" in point.nested


def test_sglangs_fused_a_gemm_function_takes_the_layer_and_its_input_first():
    """The hook binds ``linear_with_fused_a_gemm``'s first two arguments as the layer and its input:
    the function the model module looks up at call time takes them so, in the SGLang the tests run
    (its venv: this one has no SGLang)."""
    import subprocess

    from test_capture_sglang import SGLANG_PYTHON

    if not SGLANG_PYTHON.is_file():
        pytest.skip(f"no SGLang venv at {SGLANG_PYTHON}")  # CI makes one (test_capture_sglang says so)
    probe = ("import inspect, sglang.srt.models.deepseek_v2 as m; "
             "print(list(inspect.signature(m.linear_with_fused_a_gemm).parameters)[:2])")
    found = subprocess.run([str(SGLANG_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip().splitlines()[-1] == "['layer', 'hidden_states']"


def sglang_extend(q_lens, prefix_lens, rows):
    """An SGLang extend step as its ForwardBatch says it (the fields the hooks read)."""
    mode = SimpleNamespace(is_decode=lambda: False, is_extend=lambda: True)
    seq_lens = [q + p for q, p in zip(q_lens, prefix_lens)]
    return SimpleNamespace(forward_mode=mode, seq_lens_cpu=torch.tensor(seq_lens), extend_seq_lens_cpu=list(q_lens),
                           extend_prefix_lens_cpu=list(prefix_lens), req_pool_indices=torch.tensor(rows),
                           out_cache_loc=torch.arange(sum(q_lens)))


def test_sglang_up_projected_prefill_is_one_ragged_call_over_all_the_steps_requests():
    """SGLang's up-projected prefill (``forward_normal_core``) runs every request of the step in one
    ragged kernel, a one-token prompt too (not split off as a decode); requests that attend to
    cached context in this form have no Definition and are refused, never recorded as a plain prefill."""
    from fi_profile.hooks.sglang import mla as sglang_mla
    from fi_profile.hooks.sglang.attention import STEP, step_batches

    STEP.begin(runner=SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(40).view(4, 10))))
    shape = mla.MlaShape(num_heads=4, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                         dtype=DType.bfloat16, sm_scale=0.1)
    batch = sglang_extend([1, 5, 3], [0, 0, 0], [2, 0, 1])
    calls = sglang_mla._ragged(batch, shape)
    assert sglang_mla._ragged(batch, shape) is calls  # the step's layout and calls built once for all its layers
    (call,) = calls
    assert call.definition.name == "mla_ragged_prefill_causal_h4_qk192_vo128"
    assert call.axes == {"len_indptr": 4, "total_q": 9, "total_kv": 9}
    assert call.tensors["qo_indptr"].tolist() == [0, 1, 6, 9] and call.scalars == {"sm_scale": 0.1}
    with pytest.raises(NotImplementedError, match="cached context"):
        sglang_mla._ragged(sglang_extend([1, 5], [0, 4], [2, 0]), shape)
    # the same step's absorbed layers split it their own way (the one-token prompt as a decode)
    decode, prefill = STEP.batches(batch, step_batches)
    assert decode.batch_size == 1 and prefill.batch_size == 2


def test_sglang_absorbed_step_runs_both_parts_between_one_pair_of_batched_gemms(monkeypatch):
    """SGLang's absorbed path over an extend step whose requests are one-token and longer: one W_UK
    batched GEMM over all the step's tokens, the latent write, the paged decode of the one-token
    requests and the paged causal prefill of the others, one W_UV batched GEMM."""
    from fi_profile.capture.recorder import RECORDER
    from fi_profile.hooks.sglang import mla as sglang_mla
    from fi_profile.hooks.sglang.attention import STEP

    STEP.begin(runner=SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(40).view(4, 10))))
    shape = mla.MlaShape(num_heads=4, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                         dtype=DType.bfloat16, sm_scale=0.1)
    calls = sglang_mla._absorbed(sglang_extend([1, 5, 3], [2, 0, 4], [2, 0, 1]), shape)
    assert [c.definition.name for c in calls] == [
        "bmm_bf16_b4_n512_k128", "mla_kv_cache_write_ckv512_kpe64_ps1", "mla_paged_decode_h4_ckv512_kpe64_ps1",
        "mla_paged_prefill_causal_h4_ckv512_kpe64_ps1", "bmm_bf16_b4_n128_k512"]
    assert calls[0].axes == {"M": 9} == calls[-1].axes and calls[1].axes["num_tokens"] == 9
    assert calls[2].axes["batch_size"] == 1 and calls[2].axes["num_kv_indices"] == 3
    assert calls[3].axes["total_q"] == 8 and calls[3].axes["num_kv_indices"] == 5 + 7
    assert calls[1].axes["num_pages"] == (RECORDER.num_pages or 0)
    # the pages are the recorder's (the engine's KV pool), whatever it holds
    monkeypatch.setattr(RECORDER, "num_pages", 123)
    STEP.begin(runner=SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(40).view(4, 10))))
    again = sglang_mla._absorbed(sglang_extend([1, 5, 3], [2, 0, 4], [2, 0, 1]), shape)
    assert again[1].axes["num_pages"] == 123 and again[2].axes["num_pages"] == 123


def test_router_gemm_with_float32_logits_has_its_own_definition_and_baseline():
    """A router GEMM of bfloat16 operands giving float32 logits (SGLang's DeepSeek MoEGate on CUDA)
    is not the bfloat16 GEMM: its own Definition (float32 C, no rounding), whose PyTorch baseline
    returns float32 too."""
    from fi_profile.families import gemm
    from fi_profile.replay.baseline_solutions import fitted_baseline

    call = gemm.sized_call(5, 8, 256, torch.bfloat16, out_dtype=torch.float32)
    definition = call.definition
    assert definition.name == "gemm_bf16_n8_k256_out_fp32" and definition.outputs["C"].dtype is DType.float32
    assert gemm.sized_call(5, 8, 256, torch.bfloat16).definition.name == "gemm_bf16_n8_k256"
    inputs, outputs = reference(None, {"M": 5}, definition=definition)
    out = outputs["C"] if isinstance(outputs, dict) else outputs
    assert out.dtype == torch.float32
    exact = inputs["A"].double() @ inputs["B"].double().T
    assert torch.allclose(out.double(), exact, atol=1e-4, rtol=1e-5)  # no bfloat16 rounding of C
    _, baseline, source = fitted_baseline(definition)
    assert baseline.file == "torch_gemm_out_fp32.py"
    namespace: dict = {}
    exec(compile(source, "baseline", "exec"), namespace)
    assert torch.allclose(namespace["run"](inputs["A"], inputs["B"]), out, atol=1e-4, rtol=1e-5)
    assert fitted_baseline(gemm.sized_call(5, 8, 256, torch.bfloat16).definition)[1].file == "torch_gemm.py"
