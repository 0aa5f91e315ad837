"""Mamba-2's selective state space layer: flashinfer-trace's ``mamba_ssu_decode_*`` and our
``mamba_ssd_prefill_*``, instantiated for other head and group counts, the prefill reference
against the decode reference (a sequence is its tokens decoded one after another), the PyTorch
baselines against the references, and the gates' values."""

from __future__ import annotations

import pytest
import torch

from fi_profile.catalog import shipped_definition
from fi_profile.entry_points import load_function, run_reference
from fi_profile.families import mamba
from fi_profile.replay.baseline_solutions import baseline_solutions
from fi_profile.replay.check import compare
from fi_profile.synthesis import synthesize_inputs

DECODE, PREFILL = "mamba_ssu_decode_h128_d64_s128_ng8", "mamba_ssd_prefill_h128_d64_s128_ng8"


def _tiny(kind: str):
    call = (mamba.decode_call(8, 64, 16, 2, 5, 3, torch.tensor([0, 1, 2])) if kind == "decode" else
            mamba.prefill_call(8, 64, 16, 2, 5, torch.tensor([0, 4, 5, 9]), torch.tensor([3, 0, 1]),
                               torch.tensor([True, False, True])))
    return call.definition


def test_the_definitions_are_instantiated_for_a_layers_heads_groups_and_state():
    decode, prefill = _tiny("decode"), _tiny("prefill")
    assert decode.name == "mamba_ssu_decode_h8_d64_s16_ng2" and decode.op_type == "mamba_ssu"
    assert prefill.name == "mamba_ssd_prefill_h8_d64_s16_ng2" and prefill.op_type == "mamba_ssd"
    for definition in (decode, prefill):
        assert "nheads == 8 and head_dim == 64 and dstate == 16 and ngroups == 2" in definition.reference
        assert definition.inputs["A"].dtype.value == "float32" and definition.inputs["D"].dtype.value == "bfloat16"
    assert shipped_definition(DECODE) is not None  # flashinfer-trace's, unchanged


def test_a_prefilled_sequence_is_its_tokens_decoded_one_after_another():
    """The prefill reference over sequences against the dataset's decode reference, token by token,
    from the slot's state or from zeros."""
    prefill = _tiny("prefill")
    axes = {"total_seq_len": 9, "num_seqs": 3, "len_cu_seqlens": 4, "state_cache_size": 5}
    inputs = synthesize_inputs(prefill, axes, seed=5)
    inputs.update(cu_seqlens=torch.tensor([0, 4, 5, 9], dtype=torch.int32),
                  state_indices=torch.tensor([3, 0, 1], dtype=torch.int32),
                  has_initial_state=torch.tensor([True, False, True]))
    output, new_state = run_reference(prefill, inputs).values()
    decode = _tiny("decode")
    head_dim, dstate = 64, 16
    expand = {"dt": lambda v: v[:, :, None].expand(-1, -1, head_dim),
              "A": lambda v: v[:, None, None].expand(-1, head_dim, dstate).contiguous(),
              "D": lambda v: v[:, None].expand(-1, head_dim).contiguous(),
              "dt_bias": lambda v: v[:, None].expand(-1, head_dim).contiguous()}
    for (start, end), slot, initial in (((0, 4), 3, True), ((4, 5), 0, False), ((5, 9), 1, True)):
        state = inputs["state"].float()  # kept in float32 between tokens, as the prefill reference keeps it
        if not initial:
            state[slot] = 0
        for t in range(start, end):
            step = {"state": state, "x": inputs["x"][t:t + 1], "B": inputs["B"][t:t + 1], "C": inputs["C"][t:t + 1],
                    "dt": expand["dt"](inputs["dt"][t:t + 1]), "A": expand["A"](inputs["A"]),
                    "D": expand["D"](inputs["D"]), "dt_bias": expand["dt_bias"](inputs["dt_bias"]),
                    "state_batch_indices": torch.tensor([slot], dtype=torch.int32)}
            y, state = run_reference(decode, step).values()
            assert compare(output[t:t + 1], y).ok, (start, t)
        assert compare(new_state[slot], state[slot].to(new_state.dtype)).ok
    assert torch.equal(new_state[2], inputs["state"][2]) and torch.equal(new_state[4], inputs["state"][4])


@pytest.mark.parametrize("name, axes, tensors", [
    (DECODE, {"batch_size": 4, "state_cache_size": 6}, {"state_batch_indices": torch.tensor([5, -1, 0, 2])}),
    (PREFILL, {"total_seq_len": 11, "num_seqs": 4, "len_cu_seqlens": 5, "state_cache_size": 6},
     {"cu_seqlens": torch.tensor([0, 6, 6, 7, 11]), "state_indices": torch.tensor([4, 1, -1, 0]),
      "has_initial_state": torch.tensor([False, True, True, True])}),
])
def test_the_torch_baselines_match_the_references(name, axes, tensors):
    """Every request at once, with a padded request (slot -1) and an empty sequence among them."""
    definition = shipped_definition(name)
    inputs = synthesize_inputs(definition, axes, seed=6)
    for key, value in tensors.items():
        inputs[key] = value.to(inputs[key].dtype)
    expected = run_reference(definition, inputs)
    (baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    found = load_function(baseline.sources[0].content, "run", label=name)(**{k: v.clone() for k, v in inputs.items()})
    for output, value in zip(definition.outputs, found):
        assert compare(value, expected[output]).ok, output


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_a_float32_state_cache_is_a_definition_of_its_own_whose_baseline_keeps_it(kind):
    """vLLM keeps Nemotron-H's SSM states in float32: ``..._state_float32``, state and new state in
    float32 (the other inputs as the dataset's), its reference and baseline agreeing."""
    call = (mamba.decode_call(8, 64, 16, 2, 5, 3, torch.tensor([0, 1, 2]), torch.float32) if kind == "decode" else
            mamba.prefill_call(8, 64, 16, 2, 5, torch.tensor([0, 4, 5, 9]), torch.tensor([3, 0, 1]),
                               torch.tensor([True, False, True]), torch.float32))
    definition = call.definition
    assert definition.name.endswith("_h8_d64_s16_ng2_state_float32")
    assert definition.inputs["state"].dtype.value == definition.outputs["new_state"].dtype.value == "float32"
    assert definition.inputs["x"].dtype.value == "bfloat16"
    axes = {**call.axes}
    inputs = synthesize_inputs(definition, axes, seed=8)
    for name, value in call.tensors.items():
        inputs[name] = value.to(inputs[name].dtype)
    expected = run_reference(definition, inputs)
    (baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    found = load_function(baseline.sources[0].content, "run", label=definition.name)(**inputs)
    for output, value in zip(definition.outputs, found):
        assert value.dtype == expected[output].dtype and compare(value, expected[output]).ok, output
    with pytest.raises(NotImplementedError, match="float16 state cache"):
        mamba.decode_call(8, 64, 16, 2, 5, 3, torch.tensor([0, 1, 2]), torch.float16)


def test_synthesized_gates_are_a_trained_layers():
    """One decay rate and step per head, in Mamba-2's initial ranges, the same over the head's
    dimensions where the decode Definition broadcasts them: a state neither explodes nor vanishes."""
    inputs = synthesize_inputs(shipped_definition(DECODE), {"batch_size": 2, "state_cache_size": 3}, seed=1)
    A, dt_bias = inputs["A"], inputs["dt_bias"].float()
    assert A.dtype == torch.float32 and bool((A <= -1).all() and (A >= -16).all())
    assert torch.equal(A, A[:, :1, :1].expand_as(A))
    step = torch.nn.functional.softplus(dt_bias)
    assert bool((step > 5e-4).all() and (step < 0.2).all())
    assert torch.equal(dt_bias, dt_bias[:, :1].expand_as(dt_bias))


def test_a_layer_the_definitions_do_not_compute_is_named():
    assert "groups" in mamba.layer_problem(6, 4)
    assert "float16" in mamba.layer_problem(8, 2, torch.float16)
    assert "mamba_ssm_cache_dtype" in mamba.layer_problem(8, 2, torch.bfloat16, torch.float16)
    assert mamba.layer_problem(8, 2, torch.bfloat16, torch.float32) is None
    assert "D in torch.float32" in mamba.layer_problem(8, 2, torch.bfloat16, torch.bfloat16, {"D": torch.float32})
    assert mamba.layer_problem(8, 2, torch.bfloat16, torch.bfloat16,
                               {"A": torch.float32, "D": torch.bfloat16, "dt_bias": torch.bfloat16}) is None


def test_mamba2s_gated_norm_is_the_gate_first_definition_as_vllms_own_pytorch_form_computes_it(monkeypatch):
    """vLLM's ``Mixer2RMSNormGated`` (SiLU of the gate times the input, then RMSNorm per group) is
    ``gated_rmsnorm_gate_first_h{H}_gs{G}``: its reference and baseline agree with the layer's own
    ``forward_native``; without its norm it is listed by name, and never the gate-after form."""
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.model_executor.layers.mamba.mamba_mixer2 import Mixer2RMSNormGated

    from fi_profile.families import rmsnorm

    # one rank, without the process groups an engine sets up
    monkeypatch.setattr(mamba_mixer2, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(mamba_mixer2, "get_tensor_model_parallel_rank", lambda: 0)

    def norm(**kwargs):
        with set_current_vllm_config(VllmConfig()):
            return Mixer2RMSNormGated(512, 2, eps=1e-5, **kwargs)

    layer = norm()
    assert rmsnorm.mixer2_gated_layer_problem(layer) is None
    x = torch.randn(7, 512, dtype=torch.bfloat16)
    (called,) = rmsnorm.mixer2_gated_layer_calls(layer, x, torch.randn_like(x))
    definition = called.definition
    assert definition.name == "gated_rmsnorm_gate_first_h512_gs256" and called.axes == {"batch_size": 7}
    assert "use_rms_norm=False" in rmsnorm.mixer2_gated_layer_problem(norm(use_rms_norm=False))
    inputs = synthesize_inputs(definition, {"batch_size": 7}, seed=2)
    expected = run_reference(definition, inputs)["output"]
    (baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    assert "GROUP_SIZE = 256" in baseline.sources[0].content
    assert compare(load_function(baseline.sources[0].content, "run", label=definition.name)(**inputs), expected).ok
    with torch.no_grad():
        layer.weight.copy_(inputs["weight"].to(layer.weight.dtype))
        native = layer.forward_native(inputs["hidden_states"], inputs["gate"])  # vLLM's own PyTorch form
    assert compare(native.to(expected.dtype), expected).ok
    # the gate-after norm of the same shape is another Definition, with another baseline
    gate_after = rmsnorm.gated_call(x, 1e-5).definition
    (other,) = [s for s in baseline_solutions(gate_after) if s.name.endswith("__torch")]
    assert "GROUP_SIZE" not in other.sources[0].content


@pytest.mark.parametrize("name, file", [(DECODE, "vllm_mamba_ssu_decode.py"), (PREFILL, "vllm_mamba_ssd_prefill.py")])
def test_vllms_triton_kernels_are_natives_that_update_the_state_in_place(name, file):
    """Offered where vLLM imports on CUDA; each writes the requests' slots of the state cache."""
    from fi_profile.families import family_of
    from fi_profile.replay.baseline_solutions import native_solution

    definition = shipped_definition(name)
    family = family_of(definition.op_type)
    (native,) = family.natives(definition, None)
    assert native.file == file
    solution = native_solution(definition, family, native)
    assert solution.spec.model_dump()["overwrites"] == {"state": "new_state"}
    assert "from vllm.model_executor.layers.mamba.ops." in solution.sources[0].content


def test_the_chunked_scan_is_judged_at_the_activations_precision_times_its_largest_output():
    """vLLM 0.26's chunked SSD scan on an H200 (Nemotron-H-8B): 2,766 of 19.6M bfloat16 outputs 0.031
    off, beyond bfloat16's atol of 0.01: its chunk products are rounded to bfloat16 before they are
    summed, which the float32 recurrence of the reference does not. The decode step is float32."""
    family = mamba.FAMILY
    prefill = shipped_definition("mamba_ssd_prefill_h128_d64_s128_ng8")
    decode = shipped_definition("mamba_ssu_decode_h128_d64_s128_ng8")
    assert family.rounds_through(prefill) is torch.bfloat16 and family.rounds_through(decode) is None
    assert family.checks_atol_of_largest(prefill) and not family.checks_atol_of_largest(decode)
    y = torch.randn(2048, 128, 64).mul(2.0).to(torch.bfloat16)
    off = y.clone()
    off.view(-1)[::5000] += 0.03125
    assert compare(off, y, True, family.rounds_through(prefill)).ok
    assert not compare(off, y).ok
