"""The causal conv1d before Gated DeltaNet's and Mamba-2's recurrences: its shipped Definitions
(a paged conv-state cache, channels first), instantiated for other channel counts and widths, their
references against an independent computation, and the PyTorch baselines against the references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fi_profile.catalog import shipped_definition
from fi_profile.entry_points import load_function, run_reference
from fi_profile.families import causal_conv1d
from fi_profile.replay.baseline_solutions import baseline_solutions
from fi_profile.replay.check import compare
from fi_profile.synthesis import synthesize_inputs

DECODE, PREFILL = "causal_conv1d_decode_c8192_w4_silu", "causal_conv1d_prefill_c8192_w4_silu"
BIAS_DECODE, BIAS_PREFILL = "causal_conv1d_decode_c10240_w4_silu_bias", "causal_conv1d_prefill_c10240_w4_silu_bias"


def conv_of_whole_sequences(x: torch.Tensor, weight: torch.Tensor, before: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence's outputs, written out as the sum over the filter's taps."""
    inputs = torch.cat([before.float(), x.float().t()], dim=1)
    width = weight.shape[1]
    taps = sum(weight[:, j].float().unsqueeze(1) * inputs[:, j:j + x.shape[0]] for j in range(width))
    if bias is not None:
        taps = taps + bias.float().unsqueeze(1)
    return F.silu(taps).t()


@pytest.mark.parametrize("bias", [False, True])
def test_the_prefill_reference_continues_a_sequence_from_its_slot_and_leaves_its_last_inputs_there(bias):
    definition = causal_conv1d.prefill_call(64, 4, "silu", 6, torch.tensor([0, 5, 6, 8]), torch.tensor([4, 1, 2]),
                                            torch.tensor([False, True, True]), bias).definition
    assert definition.name == "causal_conv1d_prefill_c64_w4_silu" + ("_bias" if bias else "")
    assert definition.const_axes["state_len"] == 3 and ("bias" in definition.inputs) == bias
    axes = {"total_seq_len": 8, "num_seqs": 3, "len_cu_seqlens": 4, "state_cache_size": 6}
    inputs = synthesize_inputs(definition, axes, seed=3)
    inputs.update(cu_seqlens=torch.tensor([0, 5, 6, 8], dtype=torch.int32),
                  conv_state_indices=torch.tensor([4, 1, 2], dtype=torch.int32),
                  has_initial_state=torch.tensor([False, True, True]))
    output, new_state = run_reference(definition, inputs).values()
    x, state, weight = inputs["x"], inputs["conv_state"], inputs["weight"]
    zeros = torch.zeros(64, 3)
    for (start, end), before in (((0, 5), zeros), ((5, 6), state[1]), ((6, 8), state[2])):
        expected = conv_of_whole_sequences(x[start:end], weight, before, inputs.get("bias"))
        assert compare(output[start:end], expected.to(output.dtype)).ok
    # the last three inputs of each sequence; a sequence of one token keeps two of its slot's
    assert torch.equal(new_state[4], x[2:5].t())
    assert torch.equal(new_state[1], torch.cat([state[1][:, 1:], x[5:6].t()], dim=1))
    assert torch.equal(new_state[2], torch.cat([state[2][:, 2:], x[6:8].t()], dim=1))
    for untouched in (0, 3, 5):
        assert torch.equal(new_state[untouched], state[untouched])


@pytest.mark.parametrize("name, axes, tensors", [
    (DECODE, {"batch_size": 5, "state_cache_size": 9}, {}),
    (BIAS_DECODE, {"batch_size": 3, "state_cache_size": 4}, {"conv_state_indices": torch.tensor([2, -1, 0])}),
    (BIAS_PREFILL, {"total_seq_len": 12, "num_seqs": 3, "len_cu_seqlens": 4, "state_cache_size": 5},
     {"cu_seqlens": torch.tensor([0, 2, 3, 12]), "conv_state_indices": torch.tensor([4, 0, 2]),
      "has_initial_state": torch.tensor([True, True, False])}),
    (DECODE, {"batch_size": 3, "state_cache_size": 4}, {"conv_state_indices": torch.tensor([2, -1, 0])}),
    (PREFILL, {"total_seq_len": 40, "num_seqs": 4, "len_cu_seqlens": 5, "state_cache_size": 7}, {}),
    (PREFILL, {"total_seq_len": 4, "num_seqs": 3, "len_cu_seqlens": 4, "state_cache_size": 3},
     {"cu_seqlens": torch.tensor([0, 1, 3, 4]), "conv_state_indices": torch.tensor([2, 0, -1]),
      "has_initial_state": torch.tensor([True, False, True])}),
])
def test_the_torch_baselines_match_the_references(name, axes, tensors):
    """Every request at once (decode) and one grouped conv per sequence (prefill), against the
    references' token-by-token loops, with padded requests (slot -1) and sequences shorter than the
    filter among them."""
    definition = shipped_definition(name)
    inputs = synthesize_inputs(definition, axes, seed=4)
    for key, value in tensors.items():
        inputs[key] = value.to(inputs[key].dtype)
    expected = run_reference(definition, inputs)
    (baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    found = load_function(baseline.sources[0].content, "run", label=name)(**{k: v.clone() for k, v in inputs.items()})
    for output, value in zip(definition.outputs, found):
        assert compare(value, expected[output]).ok, output


def test_a_conv1d_the_definitions_do_not_compute_is_named():
    assert "'relu'" in causal_conv1d.layer_problem("relu")
    assert "float16" in causal_conv1d.layer_problem("silu", torch.float16)
    assert causal_conv1d.layer_problem("silu", torch.bfloat16) is None


@pytest.mark.parametrize("name, held", [(DECODE, {"x": "output", "conv_state": "new_conv_state"}),
                                        (PREFILL, {"conv_state": "new_conv_state"}),
                                        (BIAS_DECODE, {"x": "output", "conv_state": "new_conv_state"}),
                                        (BIAS_PREFILL, {"conv_state": "new_conv_state"})])
def test_vllms_triton_kernels_are_natives_that_work_in_place_as_the_engine_calls_them(name, held):
    """Offered where vLLM imports on CUDA: the decode kernel writes its output over ``x``, both
    update the requests' slots of the cache. SGLang's copies (where SGLang imports) update the
    cache alike; its decode returns a new output."""
    from fi_profile.families import family_of
    from fi_profile.replay.baseline_solutions import native_solution

    definition = shipped_definition(name)
    family = family_of("causal_conv1d")
    vllm, sglang = family.natives(definition, None)
    solution = native_solution(definition, family, vllm)
    assert solution.spec.model_dump()["overwrites"] == held
    assert "from vllm.model_executor.layers.mamba.ops.causal_conv1d import" in solution.sources[0].content
    solution = native_solution(definition, family, sglang)
    assert solution.spec.model_dump()["overwrites"] == {"conv_state": "new_conv_state"}
    assert "from sglang.kernels.ops.mamba.causal_conv1d_triton import" in solution.sources[0].content
