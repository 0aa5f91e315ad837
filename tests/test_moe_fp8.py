"""FP8 block-scale MoE layers (DeepSeek-V3/R1, Qwen3-FP8) in flashinfer-trace's interface: the
Definitions made for a layer's constants, named as the dataset names them; their references against
the unquantized MoE's on the dequantized operands (which also pins the [up; gate] order); the
engines' FP8 experts recorded as their input's quantization then the MoE, other FP8 paths listed."""

import json
from types import SimpleNamespace

import pytest
import torch

from fi_profile.catalog import shipped_definition
from fi_profile.entry_points import run_reference
from fi_profile.families import moe
from fi_profile.synthesis import synthesize_inputs

ROUTING = moe.DeepSeekRouting(n_group=4, topk_group=2, renormalize=True, routed_scaling_factor=2.5)


def fp8_calls(experts=16, hidden=256, intermediate=128, bias=torch.float32, logits=torch.float32, **kwargs):
    x = torch.zeros(1, hidden, dtype=torch.bfloat16)
    routing = kwargs.pop("deepseek", ROUTING)
    return moe.layer_calls(x, torch.zeros(1, experts, dtype=logits), [], num_experts=experts, top_k=4,
                           intermediate_size=intermediate, renormalize=True, deepseek=routing,
                           routing_bias=None if routing is None else torch.zeros(experts, dtype=bias),
                           fp8_block_scale=True, **kwargs)


def test_a_layer_is_its_inputs_quantization_then_the_moe_named_as_flashinfer_trace_names_it():
    quant, layer = fp8_calls()
    assert quant.definition.name == "quant_fp8_per_token_group_k256_g128" and quant.axes == {"M": 1}
    # the dataset's DeepSeek Definitions take a bf16 correction bias; the engines hold it in float32
    assert layer.definition.name == "moe_fp8_block_scale_ds_routing_topk4_ng4_kg2_e16_h256_i128_bias_fp32"
    assert layer.scalars == {"local_expert_offset": 0, "routed_scaling_factor": 2.5}
    assert layer.definition.inputs["hidden_states"].dtype.value == "float8_e4m3fn"
    assert layer.definition.inputs["routing_bias"].dtype.value == "float32"
    assert fp8_calls(bias=torch.bfloat16)[1].definition.name == "moe_fp8_block_scale_ds_routing_topk4_ng4_kg2_e16_h256_i128"
    shared = fp8_calls(shared_experts=1)[1].definition
    assert shared.name.endswith("_e16_h256_i128_shared1_bias_fp32") and shared.const_axes["num_weight_experts"] == 17
    ep = fp8_calls(local=moe.LocalExperts(8, 8))[1]
    assert ep.definition.name.endswith("_e8_h256_i128_bias_fp32_ep2") and ep.scalars["local_expert_offset"] == 8
    renorm = fp8_calls(deepseek=None, logits=torch.bfloat16)[1].definition
    assert renorm.name == "moe_fp8_block_scale_renorm_topk4_e16_h256_i128" and "E = 16" in renorm.reference


def test_deepseek_v3_at_ep8_and_qwen3_moe_layers_are_the_datasets_own_definitions():
    """DeepSeek-V3's layer on one of 8 expert-parallel ranks (with the dataset's bf16 bias) and
    Qwen3-30B-A3B's are flashinfer-trace's Definitions, as shipped; a layer that only shares the
    name's sizes (32 experts unsplit) is not."""
    routing = moe.DeepSeekRouting(8, 4, True, 2.5)
    x = torch.zeros(1, 7168, dtype=torch.bfloat16)
    (_, ep8) = moe.layer_calls(x, torch.zeros(1, 256), [], num_experts=256, top_k=8, intermediate_size=2048,
                               renormalize=True, deepseek=routing, routing_bias=torch.zeros(256, dtype=torch.bfloat16),
                               local=moe.LocalExperts(64, 32), fp8_block_scale=True)
    dataset = shipped_definition("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048")
    assert ep8.definition is dataset and ep8.scalars["local_expert_offset"] == 64
    (_, unsplit) = moe.layer_calls(x, torch.zeros(1, 32), [], num_experts=32, top_k=8, intermediate_size=2048,
                                   renormalize=True, deepseek=moe.DeepSeekRouting(8, 4, True, 2.5),
                                   routing_bias=torch.zeros(32, dtype=torch.bfloat16), fp8_block_scale=True)
    assert unsplit.definition.name == "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048_ep1"
    assert unsplit.definition.const_axes["num_experts"] == 32
    (_, qwen) = moe.layer_calls(torch.zeros(1, 2048, dtype=torch.bfloat16), torch.zeros(1, 128, dtype=torch.bfloat16),
                                [], num_experts=128, top_k=8, intermediate_size=768, renormalize=True,
                                fp8_block_scale=True)
    assert qwen.definition is shipped_definition("moe_fp8_block_scale_renorm_topk8_e128_h2048_i768")
    for hidden, intermediate, top_k in ((4096, 1536, 8), (2048, 512, 10)):  # Qwen3-235B-A22B, and the dataset's top-10 one
        (_, layer) = moe.layer_calls(torch.zeros(1, hidden, dtype=torch.bfloat16), torch.zeros(1, 128, dtype=torch.bfloat16),
                                     [], num_experts=128, top_k=top_k, intermediate_size=intermediate, renormalize=True,
                                     fp8_block_scale=True)
        assert "status:verified" in layer.definition.tags  # flashinfer-trace's own file, not one made from a template


def _dequantized(inputs, swap):
    """The FP8 inputs in float32 as the unquantized MoE takes them: gemm1's [up; gate] swapped to
    the [gate; up] the bf16 Definitions hold (``swap``)."""
    block = 128

    def blocks(q, scale):
        s = scale.float().repeat_interleave(block, -2).repeat_interleave(block, -1)
        return q.float() * s[..., : q.shape[-2], : q.shape[-1]]

    hidden = inputs["hidden_states"].float() * inputs["hidden_states_scale"].float().T.repeat_interleave(block, 1)
    w1 = blocks(inputs["gemm1_weights"], inputs["gemm1_weights_scale"])
    if swap:
        w1 = torch.cat(w1.chunk(2, dim=1)[::-1], dim=1)
    return hidden, w1, blocks(inputs["gemm2_weights"], inputs["gemm2_weights_scale"])


def _unquantized(routing, experts=16, shared=0, local=None, logits=torch.float32):
    x = torch.zeros(1, 256, dtype=torch.float32)
    return moe.call(x, torch.zeros(1, experts, dtype=logits), num_experts=experts, top_k=4, intermediate_size=128,
                    renormalize=True, deepseek=routing,
                    routing_bias=None if routing is None else torch.zeros(experts), shared_experts=shared,
                    local=local).definition


@pytest.mark.parametrize("shared", [0, 1])
def test_the_deepseek_reference_is_the_unquantized_moe_on_the_dequantized_operands(shared):
    """The FP8 Definition's reference equals the float32 unquantized DeepSeek MoE's given the
    dequantized activations and weights, gemm1's halves swapped: the same routing, the same scaling,
    flashinfer-trace's [up; gate] order; a fused shared expert at weight 1."""
    made = fp8_calls(shared_experts=shared)[1].definition
    inputs = synthesize_inputs(made, {"seq_len": 24}, seed=5)
    assert all(torch.isfinite(t.float()).all() for t in inputs.values() if isinstance(t, torch.Tensor))
    out = run_reference(made, inputs)["output"]
    hidden, w1, w2 = _dequantized(inputs, swap=True)
    plain = _unquantized(moe.DeepSeekRouting(4, 2, True, inputs["routed_scaling_factor"]), shared=shared)
    expected = run_reference(plain, {"hidden_states": hidden, "routing_logits": inputs["routing_logits"],
                                     "routing_bias": inputs["routing_bias"], "gemm1_weights": w1, "gemm2_weights": w2})
    assert out.dtype == torch.bfloat16 and out.abs().max() > 0.1
    torch.testing.assert_close(out.float(), expected["output"], atol=2e-2 * expected["output"].abs().max().item(), rtol=1e-2)
    # the order matters: unswapped, the halves' roles change and so does the output
    _, unswapped, _ = _dequantized(inputs, swap=False)
    other = run_reference(plain, {"hidden_states": hidden, "routing_logits": inputs["routing_logits"],
                                  "routing_bias": inputs["routing_bias"], "gemm1_weights": unswapped, "gemm2_weights": w2})
    assert not torch.allclose(other["output"], expected["output"], atol=1e-2)


def test_the_expert_parallel_parts_sum_to_the_whole_layer():
    whole = fp8_calls()[1].definition
    inputs = synthesize_inputs(whole, {"seq_len": 20}, seed=7)
    expected = run_reference(whole, inputs)["output"].double()
    parts = torch.zeros_like(expected)
    for rank in range(2):
        made = fp8_calls(local=moe.LocalExperts(8 * rank, 8))[1].definition
        rank_inputs = dict(inputs, local_expert_offset=8 * rank, **{
            name: inputs[name][8 * rank:8 * rank + 8]
            for name in ("gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale")})
        part = run_reference(made, rank_inputs)["output"]
        assert part.abs().sum() > 0
        parts += part.double()
    torch.testing.assert_close(parts, expected, atol=2e-2 * expected.abs().max().item(), rtol=2e-2)


def test_the_renormalized_softmax_reference_is_flashinfer_traces_instantiated():
    """Qwen3-style routing (softmax top-k, renormalized): flashinfer-trace's own reference set to the
    layer's sizes, against the unquantized renormalized MoE on the dequantized operands."""
    made = fp8_calls(deepseek=None, logits=torch.bfloat16)[1].definition
    inputs = synthesize_inputs(made, {"seq_len": 16}, seed=3)
    out = run_reference(made, inputs)["output"]
    hidden, w1, w2 = _dequantized(inputs, swap=True)
    plain = _unquantized(None, logits=torch.bfloat16)
    expected = run_reference(plain, {"hidden_states": hidden, "routing_logits": inputs["routing_logits"],
                                     "gemm1_weights": w1, "gemm2_weights": w2})["output"]
    torch.testing.assert_close(out.float(), expected, atol=2e-2 * expected.abs().max().item(), rtol=1e-2)


def test_small_fp8_moe_definitions_replay_with_their_baselines_on_cpu(tmp_path):
    from test_replay import run_replay

    definitions = [fp8_calls()[1].definition, fp8_calls(deepseek=None, logits=torch.bfloat16)[1].definition]
    for made in definitions:
        for kind in ("definitions", "workloads"):
            (tmp_path / kind / "moe").mkdir(parents=True, exist_ok=True)
        (tmp_path / "definitions" / "moe" / f"{made.name}.json").write_text(made.to_json())
        lines = [json.dumps({"definition": made.name, "workload": {
            "uuid": f"{made.name}-{t}", "axes": {"seq_len": t},
            "inputs": {n: ({"type": "scalar", "value": 2.5} if n == "routed_scaling_factor" else {"type": "random"})
                       for n in made.inputs}}}) for t in (1, 9)]
        (tmp_path / "workloads" / "moe" / f"{made.name}.jsonl").write_text("\n".join(lines) + "\n")
    _, results = run_replay(tmp_path, tmp_path / "out", [], timeout_s=300)
    assert {r.kernel_id for r in results} == {d.name for d in definitions}
    assert results and {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    # the PyTorch baselines (bfloat16 GEMMs on the dequantized weights) pass beside the references
    assert {r.source.rsplit("__", 1)[-1] for r in results} >= {"torch"}
    assert {r.kernel_id for r in results if r.source.endswith("__torch")} == {d.name for d in definitions}


class Fp8MoEMethod(SimpleNamespace):
    pass


def test_sglangs_fp8_block_experts_are_recorded_and_other_fp8_experts_listed(monkeypatch):
    from fi_profile.hooks.sglang import moe as sglang_moe
    from fi_profile.hooks.sglang.attention import STEP

    def experts(**method):
        quant = Fp8MoEMethod(**{"block_quant": True, "weight_block_size": [128, 128], "use_mxfp8": False,
                                "is_fp4_expert": False, "quant_config": SimpleNamespace(activation_scheme="dynamic"),
                                **method})
        return SimpleNamespace(num_experts=17, num_local_experts=17, intermediate_size_per_partition=128,
                               quant_method=quant, moe_runner_config=SimpleNamespace(
                                   activation="silu", is_gated=True, apply_router_weight_on_input=False,
                                   routed_scaling_factor=2.5))

    config = SimpleNamespace(top_k=5, scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=4, topk_group=2,
                             renormalize=True, routed_scaling_factor=2.5, correction_bias=torch.zeros(16),
                             num_fused_shared_experts=1, custom_routing_function=None)
    hidden, logits = torch.zeros(3, 256, dtype=torch.bfloat16), torch.zeros(3, 16)
    STEP.begin()
    assert sglang_moe.fp8_block_problem(experts()) is None
    sglang_moe.routing_calls(SimpleNamespace(topk_config=config), logits)
    quant, layer = sglang_moe.layer_calls(experts(), hidden)
    assert quant.definition.name == "quant_fp8_per_token_group_k256_g128" and quant.axes == {"M": 3}
    assert layer.definition.name == "moe_fp8_block_scale_ds_routing_topk4_ng4_kg2_e16_h256_i128_shared1_bias_fp32"
    for method, said in (({"weight_block_size": [64, 64]}, "[64, 64] blocks"), ({"use_mxfp8": True}, "MXFP8"),
                         ({"quant_config": SimpleNamespace(activation_scheme="static")}, "static activation scales"),
                         ({"block_quant": False}, "without weight blocks")):
        assert said in sglang_moe.fp8_block_problem(experts(**method))
        sglang_moe.routing_calls(SimpleNamespace(topk_config=config), logits)
        with pytest.raises(NotImplementedError, match="MoE layer without a Definition"):
            sglang_moe.layer_calls(experts(**method), hidden)
    # SGLang's DeepGEMM experts: power-of-two scales on Blackwell (listed, as its linear layers are)
    deep_gemm = SimpleNamespace(runner_backend=SimpleNamespace(is_deep_gemm=lambda: True))
    assert sglang_moe.fp8_block_problem(experts(runner=deep_gemm)) is None  # Hopper: float32 scales
    monkeypatch.setattr(sglang_moe.sglang_fp8, "ue8m0_scales", lambda: True)
    assert "UE8M0" in sglang_moe.fp8_block_problem(experts(runner=deep_gemm))
    assert sglang_moe.fp8_block_problem(experts()) is None  # its Triton experts: float32 scales
    sglang_moe.routing_calls(SimpleNamespace(topk_config=config), logits)
    with pytest.raises(NotImplementedError, match="UE8M0"):
        sglang_moe.layer_calls(experts(runner=deep_gemm), hidden)


def _vllm_runner(backend="TRITON", entry=lambda: None, gate=None, **method):
    """A vLLM MoERunner of DeepSeek routing over 16 FP8 block-scale experts (``entry``: its
    ``_forward_entry``, an ``OpOverload`` where the experts run inside vLLM's opaque op)."""
    router = type("GroupedTopKRouter", (SimpleNamespace,), {})(
        top_k=4, renormalize=True, global_num_experts=16, scoring_func="sigmoid", num_expert_group=4, topk_group=2,
        e_score_correction_bias=torch.zeros(16), use_grouped_topk=True, routed_scaling_factor=2.5)
    config = SimpleNamespace(num_local_experts=16, intermediate_size_per_partition=128, is_act_and_mul=True,
                             moe_parallel_config=SimpleNamespace(enable_eplb=False, use_all2all_kernels=False))
    quant = Fp8MoEMethod(**{"block_quant": True, "weight_block_size": [128, 128], "moe_block_shape": [128, 128],
                            "fp8_backend": SimpleNamespace(name=backend), **method})
    module = torch.nn.Module()
    module.__dict__.update(router=router, moe_config=config, routed_experts=SimpleNamespace(
        quant_method=quant, activation="silu"), expert_map=None, _forward_entry=entry, gate=gate)
    return module


def test_vllms_fp8_block_experts_are_recorded_on_its_block_backends_and_listed_elsewhere(monkeypatch):
    from fi_profile.hooks.vllm import moe as vllm_moe

    runner = _vllm_runner
    assert vllm_moe.layer_problem(runner()) is None
    assert vllm_moe.layer_problem(runner(moe_block_shape=None)) is None  # vLLM 0.26: the checkpoint's blocks only
    quant, layer = vllm_moe.layer_calls(runner(), torch.zeros(5, 256, dtype=torch.bfloat16), torch.zeros(5, 16))
    assert (quant.definition.name, layer.definition.name) == (
        "quant_fp8_per_token_group_k256_g128", "moe_fp8_block_scale_ds_routing_topk4_ng4_kg2_e16_h256_i128_bias_fp32")
    assert layer.scalars == {"local_expert_offset": 0, "routed_scaling_factor": 2.5}
    # where vLLM uses DeepGEMM's E8M0 (its default on Hopper and Blackwell with DeepGEMM) every FP8
    # MoE input is quantized with power-of-two scales, whichever backend: that quantization's own
    # Definition, then the same MoE
    monkeypatch.setattr(vllm_moe, "power_of_two_scales", lambda: True)
    quant, same = vllm_moe.layer_calls(runner(), torch.zeros(5, 256, dtype=torch.bfloat16), torch.zeros(5, 16))
    assert (quant.definition.name, same.definition) == ("quant_fp8_per_token_group_ue8m0_k256_g128", layer.definition)
    monkeypatch.undo()
    for made, said in ((runner("MARLIN"), "MARLIN backend"), (runner("CPU"), "CPU backend"),
                       (runner(block_quant=False), "without weight blocks"),
                       (runner(moe_block_shape=[64, 128]), "[128, 128] and [64, 128] blocks")):
        assert said in vllm_moe.layer_problem(made)
        with pytest.raises(NotImplementedError, match="MoE layer without a Definition"):
            vllm_moe.layer_calls(made, torch.zeros(5, 256, dtype=torch.bfloat16), torch.zeros(5, 16))


def test_vllms_router_held_by_the_runner_is_recorded_as_its_linear_method_runs_it(monkeypatch):
    """A runner that applies its router inside vLLM's opaque op records the router's GEMM: an FP8
    checkpoint that does not exempt the router (found on an H200 with a Qwen3-30B-A3B FP8 config)
    runs it as a block-scale FP8 layer, its input's quantization and the FP8 GEMM, never as the
    bf16 GEMM an unquantized router is; a method no hook records records nothing (it is listed)."""
    from fi_profile.hooks.vllm import fp8_linear as vllm_fp8
    from fi_profile.hooks.vllm import moe as vllm_moe

    monkeypatch.setattr(vllm_fp8, "layer_problem", lambda layer: None)  # a block-scaled kernel vLLM selected
    OpOverload = type("OpOverload", (), {})

    def gate(method):
        return SimpleNamespace(output_size_per_partition=16, input_size_per_partition=256, bias=None,
                               quant_method=type(method, (SimpleNamespace,), {})(
                                   block_quant=True, weight_block_size=[128, 128],
                                   fp8_linear=SimpleNamespace(quant_fp8=SimpleNamespace(use_ue8m0=False))))

    x, logits = torch.zeros(5, 256, dtype=torch.bfloat16), torch.zeros(5, 16)
    names = [c.definition.name for c in vllm_moe.layer_calls(_vllm_runner(entry=OpOverload(), gate=gate("Fp8LinearMethod")),
                                                             x, logits)]
    assert names[:3] == ["quant_fp8_per_token_group_k256_g128", "gemm_fp8_block_scale_n16_k256",
                         "quant_fp8_per_token_group_k256_g128"]
    names = [c.definition.name for c in vllm_moe.layer_calls(
        _vllm_runner(entry=OpOverload(), gate=gate("UnquantizedLinearMethod")), x, logits)]
    assert names[0] == "gemm_bf16_n16_k256"
    names = [c.definition.name for c in vllm_moe.layer_calls(
        _vllm_runner(entry=OpOverload(), gate=gate("AWQLinearMethod")), x, logits)]
    assert names[0] == "quant_fp8_per_token_group_k256_g128" and len(names) == 2


def test_fp8_moe_outputs_are_checked_at_fp8_precision_and_unquantized_ones_at_bf16s():
    """The engines' FP8 experts quantize the SwiGLU output again before gemm2, which the reference
    keeps in float32: an output off by 3% of the largest (what that rounding leaves, measured with
    vLLM's kernel on an H200) passes an FP8 MoE's check, one off by 10% fails it; the bf16 MoE's
    check stays at bfloat16's precision."""
    from fi_profile.families import family_of
    from fi_profile.replay.check import compare

    fp8 = fp8_calls()[1].definition
    family = family_of(fp8.op_type)
    assert family.rounds_through(fp8) is torch.float8_e4m3fn
    assert family.rounds_through(_unquantized(ROUTING)) is None
    ref = torch.linspace(-4, 4, 1000).to(torch.bfloat16)
    for off, ok in ((0.03 * 4, True), (0.10 * 4, False)):
        out = ref.float().clone()
        out[::7] += off
        assert compare(out.to(torch.bfloat16), ref, True, torch.float8_e4m3fn).ok is ok
    assert not compare((ref.float() + 0.03 * 4).to(torch.bfloat16), ref, True).ok
