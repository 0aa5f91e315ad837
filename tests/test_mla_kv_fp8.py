"""MLA over an FP8 (e4m3) latent cache (``kv_cache_dtype=fp8``, vLLM's TRITON_MLA): the latent write
quantizes each latent and rotary key by the layer's one scale, the absorbed decode reads the cache
dequantized by it with queries in the model's dtype. The references against the bf16 ones on the
dequantized cache; references and PyTorch baselines at small shapes on CPU; vLLM's Triton MLA
layers recorded so, other implementations, FP8 queries and DeepSeek's own FP8 layout listed."""

from types import SimpleNamespace

import pytest
import torch
from test_mla import SHAPE, step

from fi_profile.capture.definition_factory import definition_for
from fi_profile.entry_points import run_reference
from fi_profile.families import kv_cache, mla
from fi_profile.schema.dtype import DType
from fi_profile.synthesis import synthesize_inputs

SCALE = 0.5
FP8_SHAPE = mla.MlaShape(**{**SHAPE.__dict__, "cache_scale": SCALE})


def _calls(shape=FP8_SHAPE, q_lens=(1, 1, 6), seq_lens=(9, 3, 6), **step_args):
    decode, prefill = step(list(q_lens), list(seq_lens), page_size=16, **step_args)
    return mla.layer_calls(decode, prefill, shape, 16, 24)


def _write(scale=SCALE, slots=(1, 2, 3)):
    return kv_cache.mla_call(len(slots), 512, 64, 16, 8, DType.bfloat16, torch.tensor(slots), scale)


def test_fp8_latent_cache_calls_are_named_so_and_carry_the_layers_scale():
    ragged, w_uk, decode, w_uv = _calls()
    assert decode.definition.name == "mla_paged_decode_h4_ckv512_kpe64_ps16_kv_fp8"
    assert decode.scalars == {"sm_scale": 0.125, "kv_scale": SCALE}
    for name in ("ckv_cache", "kpe_cache"):
        assert decode.definition.inputs[name].dtype is DType.float8_e4m3fn
    assert decode.definition.inputs["q_nope"].dtype is DType.bfloat16
    # the new tokens' prefill attends its unquantized latents up-projected: the cache is not read
    assert ragged.definition.name == "mla_ragged_prefill_causal_h4_qk128_vo64" and "kv_scale" not in ragged.scalars
    assert _calls(SHAPE)[2].definition.name == "mla_paged_decode_h4_ckv512_kpe64_ps16"
    write = _write()
    assert write.definition.name == "mla_kv_cache_write_ckv512_kpe64_ps16_kv_fp8" and write.scalars == {"kv_scale": SCALE}
    assert write.definition.outputs["ckv_cache_out"].dtype is DType.float8_e4m3fn
    assert _write(None).definition.name == "mla_kv_cache_write_ckv512_kpe64_ps16" and _write(None).scalars == {}


def test_short_queries_run_as_decodes_over_an_fp8_cache_have_no_definition():
    """A backend that runs speculative tokens absorbed (the paged prefill) over an FP8 latent cache:
    no Definition computes that, and the call says so (a hook error naming it)."""
    with pytest.raises(NotImplementedError, match="FP8 latent cache"):
        _calls(q_lens=(1, 3, 8), seq_lens=(9, 12, 8), decode_max_query=4)


def test_the_fp8_decode_reference_is_the_bf16_one_on_the_dequantized_cache():
    fp8, plain = _calls()[2], _calls(SHAPE)[2]
    given = {name: tensor() if callable(tensor) else tensor for name, tensor in fp8.tensors.items()}
    inputs = synthesize_inputs(fp8.definition, dict(fp8.axes), seed=3, given=given)
    assert inputs["ckv_cache"].dtype == torch.float8_e4m3fn
    assert not torch.isnan(inputs["ckv_cache"].float()).any() and 0.3 < inputs["ckv_cache"].float().std() < 3
    inputs.update(kv_scale=SCALE, sm_scale=0.125)
    out = run_reference(fp8.definition, inputs)
    dequantized = {**{n: v for n, v in inputs.items() if n != "kv_scale"},
                   **{n: (inputs[n].float() * SCALE).to(torch.bfloat16) for n in ("ckv_cache", "kpe_cache")}}
    expected = run_reference(plain.definition, dequantized)
    torch.testing.assert_close(out["output"], expected["output"], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out["lse"], expected["lse"], atol=2e-2, rtol=1e-3)


def test_the_fp8_latent_write_stores_each_value_over_the_scale_saturated():
    slots = torch.tensor([5, 16 * 2 + 3, -1], dtype=torch.int64)
    write = _write(slots=tuple(slots.tolist()))
    inputs = synthesize_inputs(write.definition, {"num_tokens": 3, "num_pages": 4}, seed=1, given={"slot_mapping": slots})
    inputs["ckv"][0, 0] = 1000.0  # beyond e4m3's range once divided by 0.5: saturated to 448
    inputs["kv_scale"] = SCALE
    before = inputs["ckv_cache"].clone()
    out = run_reference(write.definition, inputs)
    flat_ckv, flat_kpe = out["ckv_cache_out"].view(-1, 512).float(), out["kpe_cache_out"].view(-1, 64).float()
    assert flat_ckv[5, 0] == 448.0
    expected = (inputs["kpe"][:2].float() / SCALE).to(torch.float8_e4m3fn).float()
    torch.testing.assert_close(flat_kpe[[5, 35]], expected)
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[[5, 35]] = False
    assert torch.equal(flat_ckv[untouched], before.view(-1, 512).float()[untouched])


def test_small_fp8_latent_cache_definitions_replay_with_their_baselines_on_cpu(tmp_path):
    from test_replay import run_replay, write_workloads

    decode, write = _calls()[2], _write()
    scalars = {"kv_scale": SCALE, "sm_scale": 0.125}
    write_workloads(tmp_path, [(decode.definition, {**decode.axes, "num_pages": 64}, scalars),
                               (write.definition, {"num_tokens": 5, "num_pages": 8}, scalars)])
    _, results = run_replay(tmp_path, tmp_path / "out", [], timeout_s=300)
    names = {decode.definition.name, write.definition.name}
    assert {r.kernel_id for r in results} == names
    assert {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    assert {r.kernel_id for r in results if r.source.endswith("__torch")} == names


def _layer(impl, kv_cache_dtype="fp8", **extra):
    layer = type("MLAAttention", (SimpleNamespace,), {})(kv_cache_dtype=kv_cache_dtype, impl=impl, _k_scale_float=SCALE,
                                                        calculate_kv_scales=False)
    for name, value in extra.items():
        setattr(layer, name, value)
    return layer


def test_vllms_fp8_latent_cache_is_recorded_on_triton_mla_and_listed_elsewhere():
    from fi_profile.hooks.vllm import mla as vllm_mla

    def impl(name, **attrs):
        return type(name, (SimpleNamespace,), {})(is_sparse=False, dcp_world_size=1, **attrs)

    triton = _layer(impl("TritonMLAImpl", supports_quant_query_input=False))
    assert vllm_mla.layer_problem(triton) is None and vllm_mla.cache_scale(triton) == SCALE
    assert vllm_mla.cache_scale(_layer(impl("TritonMLAImpl"), "auto")) is None
    for layer, said in ((_layer(impl("FlashMLAImpl")), "KV cache fp8 on FlashMLAImpl"),
                        (_layer(impl("TritonMLAImpl", supports_quant_query_input=True)), "queries quantized to FP8"),
                        (_layer(impl("TritonMLAImpl"), "fp8_ds_mla"), "KV cache fp8_ds_mla"),
                        (_layer(impl("TritonMLAImpl"), calculate_kv_scales=True), "calculate_kv_scales")):
        assert said in vllm_mla.layer_problem(layer), layer


# -- SGLang: its pool casts the latents to FP8, its Triton decode casts the query latent too -------


def _sglang_layer(k_scale=None, heads=4):
    """SGLang's ``DeepseekV2AttentionMLA`` as its hooks read it; its absorbed attention layer holding
    the checkpoint's KV scales (``k_scale``) or none."""
    scales = {} if k_scale is None else {"k_scale": object(), "v_scale": object(), "k_scale_float": k_scale,
                                         "v_scale_float": k_scale}
    attn_mqa = SimpleNamespace(**{"k_scale": None, "v_scale": None, **scales})
    return type("DeepseekV2AttentionMLA", (SimpleNamespace,), {})(
        num_local_heads=heads, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
        scaling=0.125, attn_mqa=attn_mqa, kv_cache_dtype="fp8_e4m3", rotary_emb=object())


def test_sglangs_fp8_latent_cache_is_read_with_an_fp8_query_latent_by_its_triton_decode():
    """SGLang's pool casts each latent to FP8 unscaled (the write's kv_scale 1.0); its Triton decode
    casts the query latent to the cache's FP8 too (``*_q_fp8_kv_fp8``, q_nope_scale 1.0). The
    pool's dtype decides, judged at each step; checkpoint scales (its prefill would write unscaled
    what its decode divides), an absorbed extend step over the FP8 cache and another backend are
    errors naming them."""
    from test_kv_cache_fp8 import _sglang_step

    from fi_profile.hooks.sglang import mla as sglang_mla

    layer = _sglang_layer()
    assert sglang_mla.layer_problem(layer) is None
    batch = _sglang_step("decode", [1, 1, 1], [5, 9, 3])
    calls = sglang_mla._absorbed(batch, sglang_mla._shape(layer, torch.bfloat16))
    assert [c.definition.name for c in calls] == [
        "bmm_bf16_b4_n512_k64", "mla_kv_cache_write_ckv512_kpe64_ps1_kv_fp8",
        "mla_paged_decode_h4_ckv512_kpe64_ps1_q_fp8_kv_fp8", "bmm_bf16_b4_n64_k512"]
    write, decode = calls[1], calls[2]
    assert write.scalars == {"kv_scale": 1.0}
    assert decode.scalars == {"sm_scale": 0.125, "kv_scale": 1.0, "q_nope_scale": 1.0}
    dtypes = {name: spec.dtype for name, spec in decode.definition.inputs.items() if spec.shape is not None}
    assert dtypes["q_nope"] is dtypes["ckv_cache"] is dtypes["kpe_cache"] is DType.float8_e4m3fn
    assert dtypes["q_pe"] is DType.bfloat16 and decode.definition.outputs["output"].dtype is DType.bfloat16
    # an FP8 checkpoint without KV scales keeps 1.0 in its attention layer: the same
    assert sglang_mla._shape(_sglang_layer(1.0), torch.bfloat16).cache_scale == 1.0

    with pytest.raises(NotImplementedError, match="checkpoint's scales"):
        sglang_mla._shape(_sglang_layer(0.5), torch.bfloat16)
    extend = _sglang_step("extend", [2, 3], [6, 3])
    with pytest.raises(NotImplementedError, match="absorbed MLA extend step over SGLang's FP8 latent cache"):
        sglang_mla._absorbed(extend, sglang_mla._shape(layer, torch.bfloat16))
    _sglang_step("decode", [1], [5], backend="FlashMLABackend")
    with pytest.raises(NotImplementedError, match="SGLang's FlashMLABackend"):
        sglang_mla._shape(layer, torch.bfloat16)
    _sglang_step("decode", [1], [5], pool_dtype=torch.bfloat16)
    plain = sglang_mla._shape(layer, torch.bfloat16)
    assert plain.cache_scale is None and plain.query_scale is None
    layer.kv_cache_dtype = "fp8_e5m2"
    assert "KV cache fp8_e5m2" in sglang_mla.layer_problem(layer)


def _sglang_decode():
    from test_kv_cache_fp8 import _sglang_step

    from fi_profile.hooks.sglang import mla as sglang_mla

    batch = _sglang_step("decode", [1, 1, 1], [5, 9, 3])
    return sglang_mla._absorbed(batch, sglang_mla._shape(_sglang_layer(), torch.bfloat16))[2]


def test_the_fp8_query_decode_reference_is_the_bf16_one_on_the_dequantized_query_and_cache():
    fp8 = _sglang_decode()
    given = {name: tensor() if callable(tensor) else tensor for name, tensor in fp8.tensors.items()}
    inputs = synthesize_inputs(fp8.definition, {**fp8.axes, "num_pages": 64}, seed=5, given=given)
    assert inputs["q_nope"].dtype == torch.float8_e4m3fn and 0.3 < inputs["q_nope"].float().std() < 3
    inputs.update(kv_scale=SCALE, q_nope_scale=2.0, sm_scale=0.125)
    out = run_reference(fp8.definition, inputs)
    bf16 = definition_for("mla_paged_decode_h16_ckv512_kpe64_ps1", "bf16", {"num_qo_heads": 4}, DType.bfloat16)
    dequantized = {**{n: v for n, v in inputs.items() if n not in ("kv_scale", "q_nope_scale")},
                   **{n: (inputs[n].float() * SCALE).to(torch.bfloat16) for n in ("ckv_cache", "kpe_cache")},
                   "q_nope": (inputs["q_nope"].float() * 2.0).to(torch.bfloat16)}
    expected = run_reference(bf16, dequantized)
    torch.testing.assert_close(out["output"], expected["output"], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out["lse"], expected["lse"], atol=2e-2, rtol=1e-3)


def test_sglangs_fp8_latent_cache_definitions_replay_with_their_baselines_on_cpu(tmp_path):
    from test_replay import run_replay, write_workloads

    decode = _sglang_decode()
    write = kv_cache.mla_call(3, 512, 64, 1, 32, DType.bfloat16, torch.tensor([1, 2, 3]), 1.0)
    scalars = {"kv_scale": 1.0, "q_nope_scale": 1.0, "sm_scale": 0.125}
    write_workloads(tmp_path, [(decode.definition, {**decode.axes, "num_pages": 64}, scalars),
                               (write.definition, {"num_tokens": 3, "num_pages": 32}, {"kv_scale": 1.0})])
    _, results = run_replay(tmp_path, tmp_path / "out", [], timeout_s=300)
    names = {decode.definition.name, write.definition.name}
    assert {r.kernel_id for r in results} == names
    assert {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    assert {r.kernel_id for r in results if r.source.endswith("__torch")} == names


def test_sglangs_triton_kernels_are_offered_where_they_compute_the_definition():
    """SGLang's Triton MLA decode for its FP8 query latent; vLLM's (bf16 queries) not. For GQA its
    grouped kernel's FP8 queries, its one-head-per-KV-head kernel's bf16 ones; never an FP8 prefill
    (its extend kernel attends bf16 new tokens)."""
    from fi_profile.families import attention

    def offered(family, definition):
        return {native.label or native.library for native in family._natives(definition, None)}

    assert offered(mla, _sglang_decode().definition) == {"flashinfer", "sglang_triton"}
    assert "vllm_triton" in offered(mla, _calls()[2].definition)
    for stage, heads, kv_heads, q_scale, sglang in (("decode", 4, 2, 1.0, True), ("decode", 4, 2, None, False),
                                                    ("decode", 4, 4, None, True), ("decode", 4, 4, 1.0, False),
                                                    ("prefill", 4, 2, 1.0, False), ("prefill", 4, 2, None, False)):
        batch = step([1, 1] if stage == "decode" else [3, 2], [5, 4], page_size=1)[0 if stage == "decode" else 1]
        call = attention.call(batch, stage, heads, kv_heads, 64, 1, 16, DType.bfloat16, 0.125, (1.0, 1.0), q_scale)
        assert ("sglang_triton" in offered(attention, call.definition)) == sglang, (stage, heads, kv_heads, q_scale)
