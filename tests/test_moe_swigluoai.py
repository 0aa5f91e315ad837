"""gpt-oss's MoE (profiler/families/moe): softmax top-k routing, biased experts and its SwiGLU
variant (``swigluoai``: clamped at 7, ``gate * sigmoid(1.702 gate) * (up + 1)`` on interleaved gate
and up rows). The Definition is named and set from the layer's constants, its reference computes
what vLLM's own activation does per expert, its PyTorch baseline agrees, and a layer of another
kind is listed, never recorded as this one."""

from __future__ import annotations

import os

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families import moe
from fi_profile.synthesis import synthesize_inputs

if os.environ.get("CI") != "true":
    pytest.importorskip("vllm")


GPT_OSS = moe.SwigluOAI()


def definition(top_k=2, experts=8, hidden=64, intermediate=32, swiglu=GPT_OSS):
    x = torch.zeros(1, hidden, dtype=torch.bfloat16)
    return moe.call(x, torch.zeros(1, experts, dtype=torch.bfloat16), num_experts=experts, top_k=top_k,
                    intermediate_size=intermediate, renormalize=True, swiglu_oai=swiglu).definition


def test_the_definition_is_named_after_its_activation_and_biases_and_takes_them():
    made = definition()
    assert made.name == "moe_bf16_renorm_topk2_e8_h64_i32_swigluoai_bias"
    assert list(made.inputs) == ["hidden_states", "routing_logits", "gemm1_weights", "gemm1_bias", "gemm2_weights",
                                 "gemm2_bias"]
    other = definition(swiglu=moe.SwigluOAI(alpha=1.5, limit=10.0))
    assert other.name == "moe_bf16_renorm_topk2_e8_h64_i32_swigluoai_a1p5_l10_bias"
    assert "ALPHA = 1.5" in other.reference and "LIMIT = 10.0" in other.reference


def _inputs(made, tokens=24, scale=8.0):
    """Inputs whose gate/up values reach past the clamp (weights scaled up), so the clamp matters."""
    inputs = synthesize_inputs(made, {"seq_len": tokens}, seed=5)
    inputs["gemm1_weights"] = (inputs["gemm1_weights"].float() * scale).to(torch.bfloat16)
    return inputs


def test_the_reference_computes_vllms_swigluoai_experts():
    """Per token and chosen expert, vLLM's own ``SwigluOAIAndMul`` on the biased gate/up GEMM, then
    the biased down GEMM, weighted: what the reference computes (in float64 here)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SwigluOAIAndMul

    with set_current_vllm_config(VllmConfig()):  # vLLM's layers are built under a config
        act = SwigluOAIAndMul(alpha=1.702, limit=7.0)
    made = definition()
    inputs = _inputs(made)
    out = run_reference(made, inputs)["output"]
    weights, ids = inputs["routing_logits"].float().softmax(-1).topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    x = inputs["hidden_states"].double()
    w1, b1, w2, b2 = (inputs[name].double() for name in ("gemm1_weights", "gemm1_bias", "gemm2_weights", "gemm2_bias"))
    expected = torch.zeros_like(x)
    clamped = False
    for t in range(x.shape[0]):
        for weight, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate_up = x[t] @ w1[e].T + b1[e]
            clamped |= bool((gate_up.abs() > 7.0).any())
            expected[t] += weight * (act.forward_native(gate_up[None])[0] @ w2[e].T + b2[e])
    assert clamped  # the inputs reach the clamp: a reference without it would differ
    torch.testing.assert_close(out.double(), expected, atol=5e-2, rtol=2e-2)
    # the biases are part of it
    unbiased = dict(inputs, gemm2_bias=torch.zeros_like(inputs["gemm2_bias"]))
    assert not torch.allclose(run_reference(made, unbiased)["output"].float(), out.float(), atol=0.05)


def test_the_pytorch_baseline_fitted_to_it_agrees_with_the_reference():
    from fi_profile.replay.baseline_solutions import fitted_baseline
    from fi_profile.replay.check import compare

    made = definition(swiglu=moe.SwigluOAI(alpha=1.5, limit=10.0))
    _, baseline, source = fitted_baseline(made)
    assert baseline.file == "torch_moe_swigluoai.py" and "ALPHA = 1.5" in source and "LIMIT = 10.0" in source
    namespace: dict = {}
    exec(compile(source, baseline.file, "exec"), namespace)
    inputs = _inputs(made)
    got = namespace["run"](**inputs)
    want = run_reference(made, inputs)["output"]
    assert compare(got, want, atol_of_largest=moe.FAMILY.atol_of_largest).ok  # the replay's own check
    # which a baseline without the clamp would fail
    namespace["LIMIT"] = 1000.0
    assert not compare(namespace["run"](**inputs), want, atol_of_largest=True).ok


@pytest.mark.parametrize("features, listed", [
    ({"activation": "swigluoai", "expert_bias": True, "swiglu_oai_recorded": True}, []),
    ({"activation": "swigluoai", "expert_bias": True}, ["activation swigluoai", "expert bias"]),
    # beside DeepSeek's routing or a quantization no hook records, the activation is still listed
    ({"activation": "swigluoai", "expert_bias": True, "swiglu_oai_recorded": True,
      "quantization": "Mxfp4MoEMethod"}, ["quantization Mxfp4MoEMethod", "activation swigluoai", "expert bias"]),
    ({"activation": "silu", "expert_bias": True, "swiglu_oai_recorded": False}, ["expert bias"]),
])
def test_only_unquantized_biased_swigluoai_experts_beside_a_softmax_router_are_recorded(features, listed):
    assert moe.problems(**features) == listed


def test_swigluoai_experts_beside_deepseeks_routing_raise_instead_of_being_recorded():
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="swigluoai experts beside DeepSeek"):
        moe.call(x, torch.zeros(1, 8), num_experts=8, top_k=2, intermediate_size=32, renormalize=True,
                 deepseek=moe.DeepSeekRouting(2, 1, True, 1.0), routing_bias=torch.zeros(8),
                 swiglu_oai=moe.SwigluOAI())
