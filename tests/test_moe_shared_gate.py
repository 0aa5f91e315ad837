"""A MoE with its shared expert fused in as one more expert, weighted per token by the sigmoid of
its gate (SGLang's Qwen3-Next on CUDA): the Definition made for a layer, its reference against the
routed MoE plus the gated shared expert, and SGLang's block hook that gives the MoE call the gate."""

from types import SimpleNamespace

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families import moe
from fi_profile.replay.baseline_solutions import native_candidates, torch_source
from fi_profile.synthesis import synthesize_inputs

HIDDEN, EXPERTS, TOP_K, INTERMEDIATE = 64, 16, 4, 32


def gated_call(gate_shape=(1, HIDDEN), **routing):
    x = torch.zeros(3, HIDDEN, dtype=torch.bfloat16)
    return moe.call(x, torch.zeros(3, EXPERTS, dtype=torch.bfloat16), num_experts=EXPERTS, top_k=TOP_K,
                    intermediate_size=INTERMEDIATE, renormalize=True, shared_experts=gate_shape[0],
                    shared_gate=torch.zeros(gate_shape, dtype=torch.bfloat16), **routing)


def test_the_reference_adds_the_shared_expert_weighted_by_the_sigmoid_of_its_gate():
    made = gated_call().definition
    assert made.name == f"moe_bf16_renorm_topk{TOP_K}_e{EXPERTS}_h{HIDDEN}_i{INTERMEDIATE}_shared1_sigmoid_gate"
    assert made.const_axes["num_weight_experts"] == EXPERTS + 1
    routed = moe.call(torch.zeros(1, HIDDEN, dtype=torch.bfloat16), torch.zeros(1, EXPERTS, dtype=torch.bfloat16),
                      num_experts=EXPERTS, top_k=TOP_K, intermediate_size=INTERMEDIATE, renormalize=True).definition
    inputs = synthesize_inputs(made, {"seq_len": 12}, seed=3)
    without = {n: inputs[n] for n in ("hidden_states", "routing_logits")}
    without.update(gemm1_weights=inputs["gemm1_weights"][:EXPERTS], gemm2_weights=inputs["gemm2_weights"][:EXPERTS])
    x, w1, w2 = (inputs[n].double() for n in ("hidden_states", "gemm1_weights", "gemm2_weights"))
    assert inputs["shared_gate_logits"].shape == (12, 1)
    gate, up = (x @ w1[EXPERTS].T).chunk(2, dim=-1)
    weight = torch.sigmoid(inputs["shared_gate_logits"].double())
    assert 0.05 < float(weight.min()) and float(weight.max()) < 0.95  # the gate's values vary: not a constant 1/2
    shared = (torch.nn.functional.silu(gate) * up) @ w2[EXPERTS].T * weight
    expected = run_reference(routed, without)["output"].double() + shared
    torch.testing.assert_close(run_reference(made, inputs)["output"].double(), expected, atol=3e-2, rtol=2e-2)


def test_only_sglang_fuses_it_and_its_baseline_fits():
    made = gated_call().definition
    assert "def run(hidden_states, routing_logits, shared_gate_logits" in torch_source(made)
    assert [n.library for _, n in native_candidates(made)] == ["sglang"]


def test_a_gate_beside_another_routing_or_of_another_shape_is_named():
    with pytest.raises(NotImplementedError, match="DeepSeek's routing"):
        gated_call(deepseek=moe.DeepSeekRouting(4, 2, True, 2.5), routing_bias=torch.zeros(EXPERTS))
    with pytest.raises(NotImplementedError, match=r"gate weight of shape \(2, 64\)"):
        moe.call(
            torch.zeros(3, HIDDEN, dtype=torch.bfloat16), torch.zeros(3, EXPERTS), num_experts=EXPERTS, top_k=TOP_K,
            intermediate_size=INTERMEDIATE, renormalize=True, shared_experts=1,
            shared_gate=torch.zeros(2, HIDDEN, dtype=torch.bfloat16))
    with pytest.raises(NotImplementedError, match="FP8 block-scale experts with a shared expert"):
        moe.layer_calls(torch.zeros(3, HIDDEN, dtype=torch.bfloat16), torch.zeros(3, EXPERTS), [],
                        num_experts=EXPERTS, top_k=TOP_K, intermediate_size=INTERMEDIATE, renormalize=True,
                        shared_experts=1, fp8_block_scale=True, shared_gate=torch.zeros(1, HIDDEN))


class UnquantizedFusedMoEMethod:
    pass


def block(**extra):
    made = SimpleNamespace(enable_shared_expert_fusion=True, num_fused_shared_experts=1,
                           shared_expert_gate=torch.nn.Linear(HIDDEN, 1, bias=False).to(torch.bfloat16),
                           _shared_expert_scale=lambda: 1.0)
    made.__dict__.update(extra)
    return made


def test_sglangs_block_gives_the_next_moe_call_its_gate():
    """``_append_shared_to_topk_output`` records nothing: the experts' call after it is the gated MoE
    (its router knows 16 experts, the experts layer holds 17). Without the block's hook the same
    layer stays the hook error naming the fusion; a scaled or biased gate is named."""
    from fi_profile.hooks.sglang import moe as sglang_moe
    from fi_profile.hooks.sglang.attention import STEP

    router = SimpleNamespace(topk_config=SimpleNamespace(top_k=TOP_K, renormalize=True, scoring_func="softmax",
                                                         use_grouped_topk=False, correction_bias=None,
                                                         custom_routing_function=None, num_fused_shared_experts=0))
    layer = SimpleNamespace(num_experts=EXPERTS + 1, num_local_experts=EXPERTS + 1, intermediate_size_per_partition=32,
                            quant_method=UnquantizedFusedMoEMethod(), moe_runner_config=SimpleNamespace(
                                activation="silu", is_gated=True, apply_router_weight_on_input=False))
    hidden, logits = torch.zeros(3, HIDDEN, dtype=torch.bfloat16), torch.zeros(3, EXPERTS, dtype=torch.bfloat16)
    STEP.begin()
    fusing = block()
    sglang_moe.routing_calls(router, logits)
    assert sglang_moe.fused_shared_gate_calls(fusing) == []
    (call,) = sglang_moe.layer_calls(layer, hidden)
    assert call.definition.name == gated_call().definition.name and call.axes == {"seq_len": 3}
    sglang_moe.routing_calls(router, logits)
    with pytest.raises(NotImplementedError, match="past the router"):
        sglang_moe.layer_calls(layer, hidden)
    # the block not fusing (its separate shared expert and fused gate kernel then run): nothing given
    assert sglang_moe.fused_shared_gate_calls(block(enable_shared_expert_fusion=False)) == []
    assert "moe_shared_gate" not in STEP.context
    with pytest.raises(NotImplementedError, match=r"scaled by 0\.5 \(expert parallelism\)"):
        sglang_moe.fused_shared_gate_calls(block(_shared_expert_scale=lambda: 0.5))
    with pytest.raises(NotImplementedError, match="a biased shared-expert gate"):
        sglang_moe.fused_shared_gate_calls(block(shared_expert_gate=torch.nn.Linear(HIDDEN, 1)))


def test_the_gate_the_block_calls_is_a_gemm_and_another_torch_linear_is_named():
    """The block calls its gate, a torch ``nn.Linear`` (one output, no bias), for the logits the MoE
    call takes: a GEMM call of one column, and the layer covered. Any other ``nn.Linear`` a model
    calls is named (no Definition is known to fit it), never recorded as a GEMM it may not be."""
    from fi_profile.hooks.sglang import moe as sglang_moe

    gate = torch.nn.Linear(HIDDEN, 1, bias=False).to(torch.bfloat16)
    (call,) = sglang_moe.torch_linear_calls(gate, torch.zeros(5, HIDDEN, dtype=torch.bfloat16))
    assert call.definition.name == f"gemm_bf16_n1_k{HIDDEN}" and call.axes == {"M": 5}
    assert gate.__dict__.get("_fi_profile_seen") and sglang_moe.one_output_linear_problem(gate) is None
    with pytest.raises(NotImplementedError, match="a torch nn.Linear no hook records"):
        sglang_moe.torch_linear_calls(torch.nn.Linear(HIDDEN, 8), torch.zeros(5, HIDDEN))
