"""Layer rules judge everything a layer holds that changes what it computes (issue 42): an
attribute a Definition does not account for is listed by name, never ignored. The attention
layers' audits are in test_attention_variants.py; here the MoE experts'."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fi_profile.families import moe
from fi_profile.hooks.sglang.moe import _experts_problems, swiglu_oai

#: SGLang 0.5.23's ``MoeRunnerConfig`` fields, as its Qwen3-MoE layers set them
PLAIN_RUNNER = dict(num_experts=8, num_local_experts=8, hidden_size=256, intermediate_size_per_partition=128,
                    layer_id=0, top_k=2, num_fused_shared_experts=0, params_dtype=torch.bfloat16,
                    routing_method_type=None, runner_backend=None, activation="silu", is_gated=True,
                    apply_router_weight_on_input=False, inplace=True, no_combine=False,
                    no_combine_keep_router_weight=False, routed_scaling_factor=None, gemm1_alpha=None, gemm1_beta=None,
                    gemm1_clamp_limit=None, swiglu_limit=None, gate_up_interleaved=True, layer=None,
                    use_tp_all_gather_activation=False, silu_mul_keep_fp32=False)


def experts(**runner):
    layer = SimpleNamespace(moe_runner_config=SimpleNamespace(**{**PLAIN_RUNNER, **runner}))
    return layer


def test_sglangs_plain_swiglu_experts_have_nothing_listed():
    assert _experts_problems(experts()) == []


def test_gpt_oss_experts_in_sglang_are_listed_not_recorded_as_plain_swiglu():
    """SGLang 0.5.16 on an H200 recorded gpt-oss-20b's experts (SwiGLU with alpha 1.702, clamped at
    7.0, biased, as its Triton ``matmul_ogs`` runs them) as ``moe_bf16_renorm_topk4_e32_h2880_i2880``,
    a Definition that computes another function: its activation is still called ``silu``."""
    layer = experts(gemm1_alpha=1.702, gemm1_clamp_limit=7.0)
    layer.w13_weight_bias = torch.zeros(8, 256)
    assert _experts_problems(layer) == ["moe_runner_config.gemm1_alpha=1.702",
                                        "moe_runner_config.gemm1_clamp_limit=7.0", "expert bias"]


def test_gpt_oss_experts_with_both_biases_are_recorded_as_its_swigluoai_moe_and_variants_of_them_listed():
    """Alpha, clamp limit and both biases: gpt-oss's experts, recorded with their constants; the
    same with gate and up not interleaved, a beta, or one bias missing is another computation."""
    def gpt_oss(**runner):
        layer = experts(gemm1_alpha=1.702, gemm1_clamp_limit=7.0, **runner)
        layer.w13_weight_bias, layer.w2_weight_bias = torch.zeros(8, 256), torch.zeros(8, 256)
        return layer

    assert swiglu_oai(gpt_oss()) == moe.SwigluOAI(1.702, 7.0) and _experts_problems(gpt_oss()) == []
    assert swiglu_oai(experts(gemm1_alpha=1.5, gemm1_clamp_limit=10.0)) is None  # no biases
    for variant, listed in (({"gate_up_interleaved": False}, "moe_runner_config.gemm1_alpha=1.702"),
                            ({"gemm1_beta": 1.0}, "moe_runner_config.gemm1_beta=1.0")):
        layer = gpt_oss(**variant)
        assert swiglu_oai(layer) is None and listed in _experts_problems(layer), _experts_problems(layer)


def test_a_runner_field_a_later_sglang_adds_is_listed_by_name():
    assert _experts_problems(experts(new_activation_scale=0.5)) == [
        "moe_runner_config.new_activation_scale=0.5 (an attribute fi-profile does not know)"]
    assert _experts_problems(experts(new_flag=False)) == []  # a feature that is off
