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


def test_shared_experts_inside_vllms_opaque_moe_op_are_recorded_by_the_moe_hook(monkeypatch):
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
    # Qwen2-MoE's and Qwen3-Next's shared expert scales its output by a sigmoid gate of one output
    # per token: its GEMM (missing from GPU records once) and the sigmoid and product (silently
    # missing once) run in the opaque op too
    gated = SimpleNamespace(**vars(mlp), expert_gate=linear(1, 7168))
    runner = SimpleNamespace(_forward_entry=OpOverload(), _shared_experts=SimpleNamespace(_layer=gated))
    assert [(c.definition.name, c.axes) for c in vllm_moe._shared_expert_calls(runner, hidden)][-3:] == [
        ("gemm_bf16_n7168_k2048", {"M": 3}), ("gemm_bf16_n1_k7168", {"M": 3}),
        ("sigmoid_gate_mul_h7168_g1", {"num_tokens": 3})]
    assert gemm.linear_calls(None, gated.expert_gate, hidden) == []
    # the MLP's own watch and its compiled template leave them to the MoE call
    assert vllm_moe.shared_mlp_traced_calls(gated, hidden) == []
    # an MLP with a module beyond those: not recorded as one (the runner's problems list it)
    odd = torch.nn.Module()
    for name, part in vars(mlp).items():
        odd.__dict__[name] = part
    odd._modules["extra_norm"] = torch.nn.LayerNorm(4)
    assert vllm_moe._shared_mlp(SimpleNamespace(_shared_experts=SimpleNamespace(_layer=odd))) is None
    # where the experts run in Python (vLLM on CPU), their own hooks see them
    eager = SimpleNamespace(_forward_entry=lambda: None, _shared_experts=SimpleNamespace(_layer=mlp))
    assert vllm_moe._shared_expert_calls(eager, hidden) == []
    # an FP8 checkpoint's block-scale shared expert: its quantizations and GEMMs, as its own hook
    # records them (that hook leaves them to this one); a method no hook records: none (listed)
    from fi_profile.hooks.vllm import fp8_linear as vllm_fp8

    Fp8LinearMethod = type("Fp8LinearMethod", (SimpleNamespace,), {})

    def fp8(n, k):
        return SimpleNamespace(output_size_per_partition=n, input_size_per_partition=k, bias=None,
                               quant_method=Fp8LinearMethod(block_quant=True, weight_block_size=[128, 128],
                                                            use_marlin=False, fp8_linear=SimpleNamespace(
                                                                quant_fp8=SimpleNamespace(use_ue8m0=False))))

    mlp = SimpleNamespace(gate_up_proj=fp8(4096, 7168), act_fn=SiluAndMul(), down_proj=fp8(7168, 2048))
    runner = SimpleNamespace(_forward_entry=OpOverload(), _shared_experts=SimpleNamespace(_layer=mlp))
    monkeypatch.setattr(vllm_fp8, "_block_kernel_problem", lambda kernel: None)  # as with vLLM's Triton kernel
    calls = vllm_moe._shared_expert_calls(runner, hidden)
    assert [c.definition.name for c in calls] == [
        "quant_fp8_per_token_group_k7168_g128", "gemm_fp8_block_scale_n4096_k7168", "silu_and_mul_i2048",
        "quant_fp8_per_token_group_k2048_g128", "gemm_fp8_block_scale_n7168_k2048"]
    assert vllm_fp8.linear_calls(mlp.gate_up_proj.quant_method, mlp.gate_up_proj, hidden) == []
    mlp.down_proj.quant_method = type("AWQLinearMethod", (), {})()
    assert [c.definition.name for c in vllm_moe._shared_expert_calls(runner, hidden)][-1] == "silu_and_mul_i2048"


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
    # one more expert than the router knows of: Qwen's sigmoid-gated shared expert, fused past the
    # router (SGLang 0.5.16 on an H100, 2026-12-07), named with the argument that runs it apart
    sglang_moe.routing_calls(topk(0), logits)
    with pytest.raises(NotImplementedError, match="fused into the routed ones past the router.*"
                                                  "disable_shared_experts_fusion=true"):
        sglang_moe.layer_calls(experts(17), hidden)
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


def ep_definition(local, experts=16):
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    call = moe.call(x, torch.zeros(1, experts), num_experts=experts, top_k=4, intermediate_size=32, renormalize=True,
                    deepseek=ROUTING, routing_bias=torch.zeros(experts), local=local)
    return call


def test_expert_parallel_ranks_each_compute_their_experts_part_and_the_parts_sum_to_the_layer():
    """Under expert parallelism a rank holds a run of the experts (``local_expert_offset`` on, as
    flashinfer-trace's EP Definitions say it): the Definition is named by the rank's experts and
    EP size, routes over all experts, and its reference and PyTorch baseline compute the rank's part
    of the sum. The ranks' parts add up to the whole layer's output."""
    from fi_profile.replay.baseline_solutions import fitted_baseline, native_candidates

    whole = definition()
    inputs = synthesize_inputs(whole, {"seq_len": 20}, seed=7)
    expected = run_reference(whole, inputs)["output"].double()
    parts = torch.zeros_like(expected)
    baseline = fitted_baseline(ep_definition(moe.LocalExperts(0, 4)).definition)[2]
    namespace: dict = {}
    exec(compile(baseline, "torch_moe_ds.py", "exec"), namespace)
    for rank in range(4):
        call = ep_definition(moe.LocalExperts(4 * rank, 4))
        made = call.definition
        assert made.name == "moe_bf16_ds_routing_topk4_ng4_kg2_e4_h64_i32_ep4"
        assert made.const_axes["num_experts"] == 16 and made.const_axes["num_local_experts"] == 4
        assert call.scalars == {"local_expert_offset": 4 * rank}
        assert made.inputs["local_expert_offset"].shape is None
        rank_inputs = dict(inputs, gemm1_weights=inputs["gemm1_weights"][4 * rank:4 * rank + 4],
                           gemm2_weights=inputs["gemm2_weights"][4 * rank:4 * rank + 4], local_expert_offset=4 * rank)
        part = run_reference(made, rank_inputs)["output"]
        assert part.abs().sum() > 0  # the routing spreads tokens over every rank's experts
        torch.testing.assert_close(namespace["run"](**rank_inputs).double(), part.double(), atol=3e-2, rtol=2e-2)
        parts += part.double()
    torch.testing.assert_close(parts, expected, atol=6e-2, rtol=2e-2)
    assert [n for _, n in native_candidates(made) if n.library == "vllm"]  # vLLM's fused MoE takes an expert map
    for uneven in (moe.LocalExperts(0, 3), moe.LocalExperts(14, 4)):
        with pytest.raises(NotImplementedError, match="no even expert-parallel split"):
            ep_definition(uneven)
    with pytest.raises(NotImplementedError, match="beside a softmax router"):
        moe.call(torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(1, 16), num_experts=16, top_k=4,
                 intermediate_size=32, renormalize=True, local=moe.LocalExperts(0, 8))


def test_expert_parallel_layers_are_recorded_from_each_engines_expert_layout():
    """vLLM: the runner's expert map (global -> local, -1 elsewhere), read once per layer; a
    round-robin map, redundant experts (EPLB) or an all-to-all dispatch stay listed. SGLang: the
    rank's run of experts by its EP rank; another dispatcher (DeepEP and the like) is listed."""
    from types import SimpleNamespace

    from fi_profile.hooks.sglang import moe as sglang_moe
    from fi_profile.hooks.vllm import moe as vllm_moe

    def runner(expert_map, **parallel):
        router = type("GroupedTopKRouter", (SimpleNamespace,), {})(
            top_k=4, renormalize=True, global_num_experts=16, scoring_func="sigmoid", num_expert_group=4, topk_group=2,
            e_score_correction_bias=torch.zeros(16), use_grouped_topk=True, routed_scaling_factor=2.5)
        config = SimpleNamespace(num_local_experts=8, intermediate_size_per_partition=32, is_act_and_mul=True,
                                 moe_parallel_config=SimpleNamespace(**{"enable_eplb": False,
                                                                        "use_all2all_kernels": False, **parallel}))
        experts = SimpleNamespace(quant_method=type("UnquantizedFusedMoEMethod", (), {})(), activation="silu")
        module = torch.nn.Module()
        module.__dict__.update(router=router, moe_config=config, routed_experts=experts, expert_map=expert_map,
                               _forward_entry=lambda: None, expert_placement_strategy="round_robin")
        return module

    linear = torch.full((16,), -1, dtype=torch.int32)
    linear[8:] = torch.arange(8, dtype=torch.int32)
    hidden, logits = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 16)
    layer = runner(linear)
    assert vllm_moe.problems(layer) == []
    (call,) = vllm_moe.layer_calls(layer, hidden, logits)
    assert call.definition.name == "moe_bf16_ds_routing_topk4_ng4_kg2_e8_h64_i32_ep2"
    assert call.scalars == {"local_expert_offset": 8}
    round_robin = torch.full((16,), -1, dtype=torch.int32)
    round_robin[1::2] = torch.arange(8, dtype=torch.int32)
    assert "expert placement round_robin" in " ".join(vllm_moe.problems(runner(round_robin)))
    assert "expert load balancing" in " ".join(vllm_moe.problems(runner(linear, enable_eplb=True)))
    assert "all-to-all" in " ".join(vllm_moe.problems(runner(linear, use_all2all_kernels=True)))

    from fi_profile.hooks.sglang.attention import STEP

    topk = SimpleNamespace(topk_config=SimpleNamespace(
        top_k=4, scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=4, topk_group=2, renormalize=True,
        routed_scaling_factor=2.5, correction_bias=torch.zeros(16), num_fused_shared_experts=0,
        custom_routing_function=None))

    def sglang_experts(rank, dispatcher="StandardDispatcher"):
        return SimpleNamespace(num_experts=16, num_local_experts=4, _num_local_routed=4, moe_ep_rank=rank,
                               _expert_storage_rank=rank, intermediate_size_per_partition=32,
                               dispatcher=type(dispatcher, (), {})(),
                               quant_method=type("UnquantizedFusedMoEMethod", (), {})(),
                               moe_runner_config=SimpleNamespace(activation="silu", is_gated=True,
                                                                 apply_router_weight_on_input=False))

    STEP.begin()
    sglang_moe.routing_calls(topk, logits)
    (call,) = sglang_moe.layer_calls(sglang_experts(3), hidden)
    assert call.definition.name == "moe_bf16_ds_routing_topk4_ng4_kg2_e4_h64_i32_ep4"
    assert call.scalars == {"local_expert_offset": 12}
    sglang_moe.routing_calls(topk, logits)
    with pytest.raises(NotImplementedError, match="tokens dispatched across ranks by DeepEPDispatcher"):
        sglang_moe.layer_calls(sglang_experts(1, "DeepEPDispatcher"), hidden)


def test_vllms_fused_moe_is_offered_under_either_name_of_its_moe_ops_module(monkeypatch):
    """vLLM's CUDA builds on the stable ABI name the module that registers ``torch.ops._moe_C``
    ``vllm._moe_C_stable_libtorch`` (0.26), its CPU builds ``vllm._moe_C``: either offers its fused
    MoE as a native (before, only the old name did, and on vLLM 0.26 it was silently never offered);
    a build with neither does not."""
    import importlib.util

    from fi_profile.replay import baseline_solutions

    present: set = set()
    real = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in present else (None if name.startswith("vllm") else real(name, *a)))
    made = definition()
    for modules, offered in (({"vllm"}, False), ({"vllm", "vllm._moe_C_stable_libtorch"}, True),
                             ({"vllm", "vllm._moe_C"}, True)):
        present.clear()
        present.update(modules)
        found = [s.name for s in baseline_solutions.native_solutions(made)]
        assert (f"{made.name}__vllm" in found) is offered, (modules, found)
