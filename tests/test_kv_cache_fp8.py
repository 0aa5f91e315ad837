"""GQA over an FP8 (e4m3) KV cache (``kv_cache_dtype=fp8``): the cache write quantizes each key and
value by the layer's static scale, attention dequantizes the cache by it. The references against
the bf16 ones on the dequantized cache; the write's reference, its PyTorch baseline and the
attention's baseline at small shapes on CPU; vLLM's layers recorded as such only where its
implementation keeps the queries unquantized, listed elsewhere."""

import json
from types import SimpleNamespace

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families import attention, kv_cache
from fi_profile.schema.dtype import DType
from fi_profile.synthesis import synthesize_inputs
from test_mla import step

SCALES = (0.5, 2.0)


def _calls(scales=SCALES):
    decode, prefill = step([1, 1, 6], [9, 3, 6], page_size=16)
    return attention.layer_calls(decode, prefill, 4, 2, 64, 16, 24, DType.bfloat16, 0.125, scales)


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


@pytest.mark.parametrize("which", [0, 1])
def test_the_fp8_reference_is_the_bf16_one_on_the_dequantized_cache(which):
    fp8, plain = _calls()[which], _calls(None)[which]
    axes = {**fp8.axes}
    given = {name: tensor() if callable(tensor) else tensor for name, tensor in fp8.tensors.items()}
    inputs = synthesize_inputs(fp8.definition, axes, seed=3, given=given)
    inputs.update(k_scale=SCALES[0], v_scale=SCALES[1], sm_scale=0.125)
    assert not torch.isnan(inputs["k_cache"].float()).any() and 0.3 < inputs["k_cache"].float().std() < 3
    out = run_reference(fp8.definition, inputs)
    dequantized = {**{n: v for n, v in inputs.items() if n not in ("k_scale", "v_scale")},
                   "k_cache": (inputs["k_cache"].float() * SCALES[0]).to(torch.bfloat16),
                   "v_cache": (inputs["v_cache"].float() * SCALES[1]).to(torch.bfloat16)}
    expected = run_reference(plain.definition, dequantized)
    torch.testing.assert_close(out["output"], expected["output"], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out["lse"], expected["lse"], atol=2e-2, rtol=1e-3)


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
    from test_replay import run_replay

    decode, prefill = _calls()
    write = kv_cache.call(3, 2, 64, 16, 8, DType.bfloat16, torch.tensor([1, 2, 3]), SCALES)
    definitions = [decode.definition, prefill.definition, write.definition]
    for made in definitions:
        for kind in ("definitions", "workloads"):
            (tmp_path / kind / made.op_type).mkdir(parents=True, exist_ok=True)
        (tmp_path / "definitions" / made.op_type / f"{made.name}.json").write_text(made.to_json())
        axes = {"kv_cache_write": {"num_tokens": 5, "num_pages": 8}}.get(made.op_type)
        call = {decode.definition.name: decode, prefill.definition.name: prefill}.get(made.name)
        workload_axes = axes or {n: v for n, v in call.axes.items()}
        scalars = {"k_scale": SCALES[0], "v_scale": SCALES[1], **({"sm_scale": 0.125} if call else {})}
        line = json.dumps({"definition": made.name, "workload": {
            "uuid": f"{made.name}-0", "axes": workload_axes,
            "inputs": {n: ({"type": "scalar", "value": scalars[n]} if n in scalars else {"type": "random"})
                       for n in made.inputs}}})
        (tmp_path / "workloads" / made.op_type / f"{made.name}.jsonl").write_text(line + "\n")
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
    for listed, said in ((layer("fp8_e5m2"), "KV cache fp8_e5m2"), (layer(impl=FlashAttentionImpl), "on FlashAttentionImpl"),
                         (layer(query_quant=object()), "queries quantized"),
                         (layer(calculate_kv_scales=True), "calculate_kv_scales"),
                         (layer("int8_per_token_head"), "KV cache int8_per_token_head")):
        assert said in vllm_attention.layer_problem(listed)
