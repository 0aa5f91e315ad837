"""DeepSeek's routing MoE (sigmoid scores, the correction bias choosing among the best expert
groups, renormalized weights times the routed scaling, SwiGLU experts) on CPU: the Definition made
for a layer's constants against vLLM's own router, and the check that holds its outputs."""

import os

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families import moe
from fi_profile.replay.check import compare
from fi_profile.synthesis import synthesize_inputs

if os.environ.get("CI") != "true":
    pytest.importorskip("vllm")

ROUTING = moe.DeepSeekRouting(n_group=4, topk_group=2, renormalize=True, routed_scaling_factor=2.5)


def definition(top_k=4, experts=16, hidden=64, intermediate=32, routing=ROUTING):
    x = torch.zeros(1, hidden, dtype=torch.bfloat16)
    call = moe.call(x, torch.zeros(1, experts), num_experts=experts, top_k=top_k, intermediate_size=intermediate,
                    renormalize=True, deepseek=routing, routing_bias=torch.zeros(experts))
    return call.definition


def test_the_definition_is_named_and_set_from_the_layers_constants():
    made = definition()
    assert made.name == "moe_bf16_ds_routing_topk4_ng4_kg2_e16_h64_i32"
    other = definition(routing=moe.DeepSeekRouting(4, 2, True, 1.0))
    assert other.name == "moe_bf16_ds_routing_topk4_ng4_kg2_e16_h64_i32_rs1"
    assert "ROUTED_SCALING_FACTOR = 1.0" in other.reference and "N_GROUP = 4" in other.reference


def test_the_reference_routes_as_vllms_grouped_top_k_router():
    """vLLM's grouped_topk (the router DeepSeek's MoE layers run) picks the experts and weights; the
    experts computed densely from its choice in float64 are what the reference computes."""
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import grouped_topk

    made = definition()
    inputs = synthesize_inputs(made, {"seq_len": 24}, seed=3)
    out = run_reference(made, inputs)["output"]
    weights, ids = grouped_topk(inputs["hidden_states"], inputs["routing_logits"], 4, True, num_expert_group=4,
                                topk_group=2, scoring_func="sigmoid", routed_scaling_factor=2.5,
                                e_score_correction_bias=inputs["routing_bias"])
    x = inputs["hidden_states"].double()
    w1, w2 = inputs["gemm1_weights"].double(), inputs["gemm2_weights"].double()
    expected = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = (x[t] @ w1[e].T).chunk(2)
            expected[t] += weight * ((torch.nn.functional.silu(gate) * up) @ w2[e].T)
    torch.testing.assert_close(out.double(), expected, atol=3e-2, rtol=2e-2)
    # the routing matters: the bias changes which experts are chosen, never how much they weigh
    unbiased = dict(inputs, routing_bias=torch.zeros_like(inputs["routing_bias"]))
    assert not torch.equal(run_reference(made, unbiased)["output"], out)


def test_moe_outputs_are_checked_at_the_rounding_of_their_largest_terms():
    """Each expert's output rounds to bf16 at its own magnitude before the top-k are added: a
    result near zero made of terms near 6 is off by one rounding step of 6 (0.031), which the MoE
    check accepts; an error of a tenth of the output's scale is not accepted."""
    ref = torch.tensor([[6.0, -5.5, 0.04, 1.0]], dtype=torch.bfloat16)
    one_step = ref.clone()
    one_step[0, 2] += 0.03125
    assert not compare(one_step, ref).ok  # bf16's own tolerance: atol 0.01
    assert compare(one_step, ref, atol_of_largest=True).ok
    wrong = ref.clone()
    wrong[0, 3] += 0.6
    assert not compare(wrong, ref, atol_of_largest=True).ok
    assert moe.FAMILY.atol_of_largest


def test_shared_experts_inside_vllms_opaque_moe_op_are_recorded_by_the_moe_hook():
    """On GPUs vLLM runs DeepSeek's shared experts inside its opaque ``moe_forward_shared`` op, which
    no CUDA-graph step shows to their own hooks: the MoE hook records their GEMMs and SwiGLU (before
    the routed experts), and their own hooks then leave them to it."""
    from types import SimpleNamespace

    from fi_profile.families import gemm, silu_and_mul
    from fi_profile.hooks.vllm import moe as vllm_moe

    UnquantizedLinearMethod = type("UnquantizedLinearMethod", (), {})
    SiluAndMul = type("SiluAndMul", (), {})
    OpOverload = type("OpOverload", (), {})

    def linear(n, k):
        return SimpleNamespace(output_size_per_partition=n, input_size_per_partition=k, quant_method=UnquantizedLinearMethod())

    mlp = SimpleNamespace(gate_up_proj=linear(4096, 7168), act_fn=SiluAndMul(), down_proj=linear(7168, 2048))
    runner = SimpleNamespace(_forward_entry=OpOverload(), _shared_experts=SimpleNamespace(_layer=mlp))
    hidden = torch.zeros(3, 7168, dtype=torch.bfloat16)
    calls = vllm_moe._shared_expert_calls(runner, hidden)
    assert [(c.definition.name, c.axes) for c in calls] == [
        ("gemm_bf16_n4096_k7168", {"M": 3}), ("silu_and_mul_i2048", {"num_tokens": 3}), ("gemm_bf16_n7168_k2048", {"M": 3})]
    assert gemm.linear_calls(None, mlp.gate_up_proj, hidden) == []
    assert silu_and_mul.layer_calls(mlp.act_fn, torch.zeros(3, 4096, dtype=torch.bfloat16)) == []
    # where the experts run in Python (vLLM on CPU), their own hooks see them
    eager = SimpleNamespace(_forward_entry=lambda: None, _shared_experts=SimpleNamespace(_layer=mlp))
    assert vllm_moe._shared_expert_calls(eager, hidden) == []


def test_sglang_router_gemm_is_recorded_from_the_logits_topk_sees():
    """SGLang's DeepSeek router (``MoEGate``, a plain weight and its own ``F.linear``) is recorded
    when ``TopK`` gets its logits: a GEMM of the gate's [experts, hidden] weight, in the operands'
    dtype, its result in the logits' dtype (float32 on CUDA: another Definition). A gate whose
    weight SGLang packed for AMX is refused, never sized from the packed tensor."""
    from types import SimpleNamespace

    from fi_profile.hooks.sglang import moe as sglang_moe
    from fi_profile.hooks.sglang.attention import STEP

    class MoEGate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(8, 64, dtype=torch.bfloat16))
            self.e_score_correction_bias_vl = None

    topk = SimpleNamespace(topk_config=SimpleNamespace(top_k=2))
    STEP.begin()
    gate, hidden = MoEGate(), torch.zeros(5, 64, dtype=torch.bfloat16)
    assert sglang_moe.gate_problem(gate) is None and sglang_moe.gate_calls(gate, hidden) == []
    (call,) = sglang_moe.routing_calls(topk, torch.zeros(5, 8, dtype=torch.float32))
    assert call.definition.name == "gemm_bf16_n8_k64_out_fp32" and call.axes == {"M": 5}
    sglang_moe.gate_calls(gate, hidden)
    (call,) = sglang_moe.routing_calls(topk, torch.zeros(5, 8, dtype=torch.bfloat16))
    assert call.definition.name == "gemm_bf16_n8_k64"
    assert sglang_moe.routing_calls(topk, torch.zeros(5, 8)) == []  # no gate ran before: nothing to record
    gate.quant_method = SimpleNamespace()
    assert "packed" in sglang_moe.gate_problem(gate)
    with pytest.raises(NotImplementedError, match="packed"):
        sglang_moe.gate_calls(gate, hidden)


def shared_definition(experts=16, top_k=4):
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    return moe.call(x, torch.zeros(1, experts), num_experts=experts, top_k=top_k, intermediate_size=32,
                    renormalize=True, deepseek=ROUTING, routing_bias=torch.zeros(experts), shared_experts=1).definition


def test_a_fused_shared_expert_is_one_more_expert_every_token_gets_at_weight_one():
    """SGLang fuses DeepSeek-V3's shared expert into the MoE (its weights after the routed experts'):
    the reference adds that expert's SwiGLU output to the routed sum for every token."""
    made = shared_definition()
    assert made.name == "moe_bf16_ds_routing_topk4_ng4_kg2_e16_h64_i32_shared1"
    assert made.const_axes["num_weight_experts"] == 17 and made.inputs["gemm1_weights"].shape[0] == "num_weight_experts"
    routed = definition()
    inputs = synthesize_inputs(made, {"seq_len": 12}, seed=5)
    assert inputs["gemm1_weights"].shape[0] == 17
    without = dict(inputs, gemm1_weights=inputs["gemm1_weights"][:16], gemm2_weights=inputs["gemm2_weights"][:16])
    x, w1, w2 = (inputs[n].double() for n in ("hidden_states", "gemm1_weights", "gemm2_weights"))
    gate, up = (x @ w1[16].T).chunk(2, dim=-1)
    shared = (torch.nn.functional.silu(gate) * up) @ w2[16].T
    expected = run_reference(routed, without)["output"].double() + shared
    torch.testing.assert_close(run_reference(made, inputs)["output"].double(), expected, atol=3e-2, rtol=2e-2)
    with pytest.raises(NotImplementedError, match="2 fused shared experts"):
        moe.call(torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(1, 16), num_experts=16, top_k=4,
                 intermediate_size=32, renormalize=True, deepseek=ROUTING, routing_bias=torch.zeros(16),
                 shared_experts=2)


def test_the_fused_shared_expert_definition_replays_with_its_baseline_on_cpu(tmp_path):
    """Reference and PyTorch baseline pass on CPU; vLLM's fused MoE (which never fuses the shared
    expert) is not offered for it."""
    import json

    from test_replay import run_replay

    from fi_profile.replay.baseline_solutions import native_candidates

    made = shared_definition()
    assert not [n for _, n in native_candidates(made) if n.library == "vllm"]
    assert [n for _, n in native_candidates(definition()) if n.library == "vllm"]
    folder, workloads = tmp_path / "definitions" / "moe", tmp_path / "workloads" / "moe"
    folder.mkdir(parents=True)
    workloads.mkdir(parents=True)
    (folder / f"{made.name}.json").write_text(made.to_json())
    lines = [json.dumps({"definition": made.name, "workload": {
        "uuid": f"w{t}", "axes": {"seq_len": t}, "inputs": {n: {"type": "random"} for n in made.inputs}}}) for t in (1, 9)]
    (workloads / f"{made.name}.jsonl").write_text("\n".join(lines) + "\n")
    _, results = run_replay(tmp_path, tmp_path / "out", [], timeout_s=300)
    assert {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    assert {r.source.rsplit("__", 1)[-1] for r in results} >= {"torch"}


def test_sglang_fused_shared_expert_is_recorded_with_deepseek_routing_and_listed_otherwise():
    """SGLang on CUDA (DeepSeek-V3/R1: 256 routed experts, one shared) gives its TopK one more slot
    and its FusedMoE one more expert: recorded as the routed top-k over the routed experts plus the
    shared one. Two fused shared experts, or weights for more experts than that (redundant experts),
    stay a hook error naming them; without DeepSeek routing the TopK is listed."""
    from types import SimpleNamespace

    from fi_profile.hooks.sglang import moe as sglang_moe
    from fi_profile.hooks.sglang.attention import STEP

    def topk(shared, **extra):
        config = SimpleNamespace(top_k=4 + shared, scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=4,
                                 topk_group=2, renormalize=True, routed_scaling_factor=2.5,
                                 correction_bias=torch.zeros(16), num_fused_shared_experts=shared,
                                 custom_routing_function=None)
        config.__dict__.update(extra)
        return SimpleNamespace(topk_config=config)

    class UnquantizedFusedMoEMethod:
        pass

    def experts(num_experts):
        return SimpleNamespace(num_experts=num_experts, num_local_experts=num_experts, intermediate_size_per_partition=32,
                               quant_method=UnquantizedFusedMoEMethod(), moe_runner_config=SimpleNamespace(
                                   activation="silu", is_gated=True, apply_router_weight_on_input=False,
                                   routed_scaling_factor=2.5))

    hidden, logits = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 16)
    STEP.begin()
    for router, layer, expected in ((topk(1), experts(17), "moe_bf16_ds_routing_topk4_ng4_kg2_e16_h64_i32_shared1"),
                                    (topk(0), experts(16), "moe_bf16_ds_routing_topk4_ng4_kg2_e16_h64_i32")):
        assert sglang_moe.routing_problem(router) is None
        sglang_moe.routing_calls(router, logits)
        (call,) = sglang_moe.layer_calls(layer, hidden)
        assert call.definition.name == expected and call.axes == {"seq_len": 3}
    sglang_moe.routing_calls(topk(1), logits)
    with pytest.raises(NotImplementedError, match="18 experts' weights for 16 routed and 1 fused shared"):
        sglang_moe.layer_calls(experts(18), hidden)
    sglang_moe.routing_calls(topk(2), logits)
    with pytest.raises(NotImplementedError, match="fused shared experts"):
        sglang_moe.layer_calls(experts(18), hidden)
    softmax = topk(1, scoring_func="softmax", use_grouped_topk=False, correction_bias=None)
    assert "fused shared experts" in sglang_moe.routing_problem(softmax)
    # SGLang 0.5.23 keeps the slots in its shared-experts layout: with waterfill balancing it gives
    # them none (top_k counts the routed experts only), another computation, listed
    waterfill = topk(0, shared_experts=SimpleNamespace(num_fused_shared_experts=1, num_shared_topk_slots=0))
    waterfill.topk_config.num_fused_shared_experts = 0
    waterfill.topk_config.num_shared_topk_slots = 0
    assert "fused shared experts" in sglang_moe.routing_problem(waterfill)
    scaled = topk(1, fused_shared_experts_scaling_factor=0.5)
    assert "fused shared experts" in sglang_moe.routing_problem(scaled)
    slots = topk(0, shared_experts=SimpleNamespace(num_fused_shared_experts=1), num_shared_topk_slots=1, top_k=5)
    slots.topk_config.num_fused_shared_experts = 0
    assert sglang_moe.routing_problem(slots) is None
    sglang_moe.routing_calls(slots, logits)
    (call,) = sglang_moe.layer_calls(experts(17), hidden)
    assert call.definition.name == "moe_bf16_ds_routing_topk4_ng4_kg2_e16_h64_i32_shared1"
