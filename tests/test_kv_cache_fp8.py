"""GQA over an FP8 (e4m3) KV cache (``kv_cache_dtype=fp8``): the cache write quantizes each key and
value by the layer's static scale, attention dequantizes the cache by it (and, where vLLM quantizes
the queries to FP8 first by their static scale, the queries too). The references against
the bf16 ones on the dequantized cache; the write's reference, its PyTorch baseline and the
attention's baseline at small shapes on CPU; vLLM's Triton attention layers recorded so (their
queries' quantization first where vLLM quantizes them by one static scale), other implementations
and other query quantizations listed; SGLang's decode steps read the FP8 cache, its extend steps
attend their new tokens unquantized."""

from types import SimpleNamespace

import pytest
import torch
from test_mla import step

from fi_profile.entry_points import run_reference
from fi_profile.families import attention, fp8_linear, kv_cache
from fi_profile.schema.dtype import DType
from fi_profile.synthesis import synthesize_inputs

SCALES = (0.5, 2.0)


def _calls(scales=SCALES, q_scale=None):
    decode, prefill = step([1, 1, 6], [9, 3, 6], page_size=16)
    return attention.layer_calls(decode, prefill, 4, 2, 64, 16, 24, DType.bfloat16, 0.125, scales, q_scale)


def test_fp8_cache_calls_are_named_so_and_carry_the_layers_scales():
    decode, prefill = _calls()
    assert (decode.definition.name, prefill.definition.name) == (
        "gqa_paged_decode_h4_kv2_d64_ps16_kv_fp8", "gqa_paged_prefill_causal_h4_kv2_d64_ps16_kv_fp8")
    assert decode.scalars == {"sm_scale": 0.125, "k_scale": 0.5, "v_scale": 2.0}
    for call in (decode, prefill):
        assert call.definition.inputs["k_cache"].dtype is DType.float8_e4m3fn
        assert call.definition.inputs["q"].dtype is DType.bfloat16
    plain, _ = _calls(None)
    assert plain.definition.name == "gqa_paged_decode_h4_kv2_d64_ps16" and "k_scale" not in plain.scalars
    write = kv_cache.call(3, 2, 64, 16, 8, DType.bfloat16, torch.tensor([1, 2, 3]), SCALES)
    assert write.definition.name == "kv_cache_write_kv2_d64_ps16_kv_fp8" and write.scalars == {"k_scale": 0.5, "v_scale": 2.0}


def test_fp8_queries_over_an_fp8_cache_are_named_so_and_carry_their_scale():
    decode, prefill = _calls(q_scale=0.25)
    assert (decode.definition.name, prefill.definition.name) == (
        "gqa_paged_decode_h4_kv2_d64_ps16_q_fp8_kv_fp8", "gqa_paged_prefill_causal_h4_kv2_d64_ps16_q_fp8_kv_fp8")
    assert decode.scalars == {"sm_scale": 0.125, "k_scale": 0.5, "v_scale": 2.0, "q_scale": 0.25}
    assert decode.definition.inputs["q"].dtype is DType.float8_e4m3fn
    assert decode.definition.outputs["output"].dtype is DType.bfloat16
    with pytest.raises(NotImplementedError, match="not FP8"):
        _calls(None, q_scale=0.25)


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("q_scale", [None, 0.25])
def test_the_fp8_reference_is_the_bf16_one_on_the_dequantized_cache(which, q_scale):
    fp8, plain = _calls(q_scale=q_scale)[which], _calls(None)[which]
    axes = {**fp8.axes}
    given = {name: tensor() if callable(tensor) else tensor for name, tensor in fp8.tensors.items()}
    inputs = synthesize_inputs(fp8.definition, axes, seed=3, given=given)
    inputs.update(k_scale=SCALES[0], v_scale=SCALES[1], sm_scale=0.125)
    assert not torch.isnan(inputs["k_cache"].float()).any() and 0.3 < inputs["k_cache"].float().std() < 3
    q = inputs["q"].float()
    if q_scale is not None:
        assert inputs["q"].dtype == torch.float8_e4m3fn and 0.3 < q.std() < 3
        inputs["q_scale"], q = q_scale, q * q_scale
    out = run_reference(fp8.definition, inputs)
    assert out["output"].dtype == torch.bfloat16
    dequantized = {**{n: v for n, v in inputs.items() if n not in ("k_scale", "v_scale", "q_scale")},
                   "q": q.to(torch.bfloat16),
                   "k_cache": (inputs["k_cache"].float() * SCALES[0]).to(torch.bfloat16),
                   "v_cache": (inputs["v_cache"].float() * SCALES[1]).to(torch.bfloat16)}
    expected = run_reference(plain.definition, dequantized)
    torch.testing.assert_close(out["output"], expected["output"], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out["lse"], expected["lse"], atol=2e-2, rtol=1e-3)


def test_static_quantization_divides_by_the_given_scale_and_saturates():
    call = fp8_linear.static_quant_call(2, 256, torch.bfloat16)
    x = torch.randn(2, 256).to(torch.bfloat16)
    x[0, 0] = 500.0
    out = run_reference(call.definition, {"x": x, "scale": 0.5})
    expected = (x.float() / 0.5).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert out["x_q"].dtype == torch.float8_e4m3fn and torch.equal(out["x_q"].float(), expected.float())
    assert out["x_q"].float()[0, 0] == 448.0


def test_the_fp8_write_stores_each_value_over_its_scale_saturated():
    write = kv_cache.call(3, 2, 64, 16, 4, DType.bfloat16, torch.tensor([5, 16 * 2 + 3, -1]), SCALES)
    slots = torch.tensor([5, 16 * 2 + 3, -1], dtype=torch.int64)
    inputs = synthesize_inputs(write.definition, {"num_tokens": 3, "num_pages": 4}, seed=1, given={"slot_mapping": slots})
    inputs["key"][0, 0, 0] = 1000.0  # beyond e4m3's range once divided by 0.5: saturated to 448
    inputs.update(k_scale=SCALES[0], v_scale=SCALES[1])
    before = inputs["k_cache"].clone()
    out = run_reference(write.definition, inputs)
    flat_k, flat_v = out["k_cache_out"].view(-1, 2, 64).float(), out["v_cache_out"].view(-1, 2, 64).float()
    assert flat_k[5, 0, 0] == 448.0
    expected_k = (inputs["key"][:2].float() / SCALES[0]).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    expected_v = (inputs["value"][:2].float() / SCALES[1]).to(torch.float8_e4m3fn).float()
    torch.testing.assert_close(flat_k[[5, 35]], expected_k)
    torch.testing.assert_close(flat_v[[5, 35]], expected_v)
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[[5, 35]] = False
    assert torch.equal(flat_k[untouched], before.view(-1, 2, 64).float()[untouched])


def test_small_fp8_cache_definitions_replay_with_their_baselines_on_cpu(tmp_path):
    from test_replay import run_replay, write_workloads

    attention_calls = [*_calls(), *_calls(q_scale=0.25)]
    write = kv_cache.call(3, 2, 64, 16, 8, DType.bfloat16, torch.tensor([1, 2, 3]), SCALES)
    quant = fp8_linear.static_quant_call(3, 256, torch.bfloat16)
    definitions = [*(c.definition for c in attention_calls), write.definition, quant.definition]
    scalars = {"k_scale": SCALES[0], "v_scale": SCALES[1], "sm_scale": 0.125, "q_scale": 0.25, "scale": 0.5}
    write_workloads(tmp_path, [*((c.definition, dict(c.axes), scalars) for c in attention_calls),
                               (write.definition, {"num_tokens": 5, "num_pages": 8}, scalars),
                               (quant.definition, {"M": 7}, scalars)])
    _, results = run_replay(tmp_path, tmp_path / "out", [], timeout_s=300)
    assert {r.kernel_id for r in results} == {d.name for d in definitions}
    assert {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    assert {r.kernel_id for r in results if r.source.endswith("__torch")} == {d.name for d in definitions}


class Attention(SimpleNamespace):
    pass


class TritonAttentionImpl(SimpleNamespace):
    pass


class FlashAttentionImpl(SimpleNamespace):
    pass


def test_vllms_fp8_cache_is_recorded_on_triton_attention_and_listed_elsewhere():
    from fi_profile.hooks.vllm import attention as vllm_attention

    def layer(kv_cache_dtype="fp8", impl=TritonAttentionImpl, **options):
        return Attention(**{"attn_type": "decoder", "sliding_window": None, "kv_cache_dtype": kv_cache_dtype,
                            "impl": impl(logits_soft_cap=None), "query_quant": None, "calculate_kv_scales": False,
                            "_k_scale_float": 0.5, "_v_scale_float": 2.0, **options})

    assert vllm_attention.layer_problem(layer()) is None and vllm_attention.cache_scales(layer()) == SCALES
    assert vllm_attention.layer_problem(layer("fp8_e4m3")) is None
    assert vllm_attention.layer_problem(layer("auto")) is None and vllm_attention.cache_scales(layer("auto")) is None
    # on CUDA vLLM quantizes the queries first, by one static scale: recorded as that quantization,
    # then attention on FP8 queries
    static = SimpleNamespace(static=True, group_shape=(-1, -1))
    quantized = layer(query_quant=static, _q_scale_float=0.25, num_heads=4, head_size=64)
    assert vllm_attention.layer_problem(quantized) is None and vllm_attention.query_scale(quantized) == 0.25
    assert vllm_attention.query_scale(layer()) is None and vllm_attention._query_quant(layer(), 3, DType.bfloat16) == []
    (quant,) = vllm_attention._query_quant(quantized, 3, DType.bfloat16)
    assert (quant.definition.name, quant.axes) == ("quant_fp8_static_per_tensor_k256", {"M": 3})
    per_head = SimpleNamespace(static=True, group_shape=(-1, 128))
    for listed, said in ((layer("fp8_e5m2"), "KV cache fp8_e5m2"), (layer(impl=FlashAttentionImpl), "on FlashAttentionImpl"),
                         (layer(query_quant=per_head), "queries quantized to FP8 otherwise than by one static scale"),
                         (layer(query_quant=SimpleNamespace(static=False, group_shape=(-1, -1))), "otherwise"),
                         (layer(calculate_kv_scales=True), "calculate_kv_scales"),
                         (layer("int8_per_token_head"), "KV cache int8_per_token_head")):
        assert said in vllm_attention.layer_problem(listed)


class Mode(SimpleNamespace):
    def is_decode(self):
        return self.kind == "decode"

    def is_extend(self):
        return self.kind == "extend"


def _sglang_step(kind, q_lens, seq_lens, pool_dtype=torch.float8_e4m3fn, backend="TritonAttnBackend"):
    """An SGLang step (ForwardBatch and model runner) of page size 1 over a KV pool of ``pool_dtype``,
    its attention backend of class ``backend``."""
    from fi_profile.hooks.sglang.attention import STEP

    runner = SimpleNamespace(token_to_kv_pool=SimpleNamespace(dtype=pool_dtype), attn_backend=type(backend, (), {})(),
                             req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(64, dtype=torch.int32).view(4, 16)))
    batch = SimpleNamespace(forward_mode=Mode(kind=kind), seq_lens_cpu=torch.tensor(seq_lens),
                            extend_seq_lens_cpu=q_lens, req_pool_indices=torch.arange(len(seq_lens)),
                            out_cache_loc=torch.arange(sum(q_lens)))
    STEP.begin(runner=runner)
    return batch


def test_sglangs_fp8_cache_is_read_by_decode_steps_and_extend_steps_attend_the_new_tokens_unquantized():
    """SGLang's pool says its dtype. With an FP8 pool a decode step reads every key and value from
    it with the layer's scales (1.0 where the checkpoint gives none): its Triton decode's grouped
    kernel casts the queries to FP8 unscaled (``*_q_fp8_kv_fp8``, q_scale 1.0), its kernel for one
    query head per KV head keeps them bf16 (``*_kv_fp8``); an extend step attends its new tokens as
    they are (the bf16 Definitions), and one with a cached prefix (read from the FP8 cache beside
    them) is an error naming it. The write quantizes either way. Another backend is an error
    naming it."""
    from fi_profile.hooks.sglang import attention as sglang_attention

    RadixAttention = type("RadixAttention", (SimpleNamespace,), {})
    layer = RadixAttention(tp_q_head_num=4, tp_k_head_num=2, head_dim=64, scaling=0.125, k_scale=None, v_scale=None,
                           attn_type="decoder", v_head_dim=64, sliding_window_size=-1, logit_cap=0,
                           is_cross_attention=False)
    scaled = RadixAttention(**{**vars(layer), "k_scale": object(), "v_scale": object(), "k_scale_float": 0.5,
                               "v_scale_float": 2.0})
    q, k = torch.zeros(3, 256, dtype=torch.bfloat16), torch.zeros(3, 128, dtype=torch.bfloat16)

    batch = _sglang_step("decode", [1, 1, 1], [5, 9, 3])
    assert sglang_attention.cache_problem(DType.bfloat16) is None
    assert sglang_attention.cache_scales(layer) == (1.0, 1.0) and sglang_attention.cache_scales(scaled) == SCALES
    write, decode = sglang_attention.layer_calls(scaled, q, batch, k)
    assert (write.definition.name, decode.definition.name) == (
        "kv_cache_write_kv2_d64_ps1_kv_fp8", "gqa_paged_decode_h4_kv2_d64_ps1_q_fp8_kv_fp8")
    assert write.scalars == {"k_scale": 0.5, "v_scale": 2.0}
    assert decode.scalars == {"sm_scale": 0.125, "k_scale": 0.5, "v_scale": 2.0, "q_scale": 1.0}
    assert decode.definition.inputs["q"].dtype is DType.float8_e4m3fn
    mha = RadixAttention(**{**vars(scaled), "tp_k_head_num": 4})  # one query head per KV head: bf16 queries
    _, decode = sglang_attention.layer_calls(mha, q, batch, torch.zeros(3, 256, dtype=torch.bfloat16))
    assert decode.definition.name == "gqa_paged_decode_h4_kv4_d64_ps1_kv_fp8" and "q_scale" not in decode.scalars
    _sglang_step("decode", [1, 1, 1], [5, 9, 3], backend="FlashInferAttnBackend")
    with pytest.raises(NotImplementedError, match="FP8 KV cache read by SGLang's FlashInferAttnBackend"):
        sglang_attention.layer_calls(scaled, q, batch, k)
    batch = _sglang_step("decode", [1, 1, 1], [5, 9, 3])

    batch = _sglang_step("extend", [2, 3], [2, 3])  # fresh prompts: no cached prefix
    write, prefill = sglang_attention.layer_calls(layer, torch.zeros(5, 256, dtype=torch.bfloat16), batch,
                                                  torch.zeros(5, 128, dtype=torch.bfloat16))
    assert write.definition.name == "kv_cache_write_kv2_d64_ps1_kv_fp8"
    assert prefill.definition.name == "gqa_paged_prefill_causal_h4_kv2_d64_ps1" and "k_scale" not in prefill.scalars

    batch = _sglang_step("extend", [2, 3], [6, 3])  # the first request's 4 tokens are cached
    with pytest.raises(NotImplementedError, match="cached prefix"):
        sglang_attention.layer_calls(layer, torch.zeros(5, 256, dtype=torch.bfloat16), batch,
                                     torch.zeros(5, 128, dtype=torch.bfloat16))

    _sglang_step("decode", [1], [5], pool_dtype=torch.bfloat16)
    assert sglang_attention.cache_problem(DType.bfloat16) is None and sglang_attention.cache_scales(layer) is None
    _sglang_step("decode", [1], [5], pool_dtype=torch.float16)
    assert "KV cache of float16 for bfloat16 queries" in sglang_attention.cache_problem(DType.bfloat16)
    from fi_profile.hooks.sglang.attention import STEP

    STEP.begin(runner=SimpleNamespace())  # a runner that does not say its pool's dtype: never assumed plain
    assert "does not say" in sglang_attention.cache_problem(DType.bfloat16)
    STEP.begin()
    assert sglang_attention.cache_problem(DType.bfloat16) is None  # no runner known (a graph's capture): judged at replays
