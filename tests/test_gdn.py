"""Gated DeltaNet (Qwen3-Next's linear attention), flashinfer-trace's ``gdn_decode_*`` and
``gdn_prefill_*`` Definitions as the dataset ships them: inputs that keep the recurrence what a
model feeds it, PyTorch baselines that match the references, and a replay of both."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import FLASHINFER_TRACE

from fi_profile.entry_points import load_function, run_reference
from fi_profile.families import gdn
from fi_profile.replay.baseline_solutions import baseline_solutions
from fi_profile.replay.check import compare
from fi_profile.replay.dataset import load_dataset
from fi_profile.replay.runner import REFERENCE, ReplayOptions, replay
from fi_profile.schema import Definition
from fi_profile.synthesis import synthesize_inputs

DECODE, PREFILL, MTP = "gdn_decode_qk4_v8_d128_k_last", "gdn_prefill_qk4_v8_d128_k_last", "gdn_mtp_qk4_v8_d128_k_last"


def dataset_definition(name: str) -> Definition:
    return Definition.model_validate_json((FLASHINFER_TRACE / "definitions" / "gdn" / f"{name}.json").read_text())


def prefill_axes(lengths: list[int]) -> dict[str, int]:
    return {"total_seq_len": sum(lengths), "num_seqs": len(lengths), "len_cu_seqlens": len(lengths) + 1}


def test_the_recurrence_gets_unit_keys_and_a_models_gates_and_stays_bounded_over_a_long_prefill():
    """The dataset's references take query and key as the delta rule uses them, unit vectors (the
    engines normalize them in their kernels); gates as a model is initialized with (A in [1, 16],
    dt in [1e-3, 1e-1]). Over 512 tokens the state then stays of the size it started with; normal
    keys of norm √128 grow it by about 128 a token, past fp32's range."""
    definition = dataset_definition(PREFILL)
    inputs = synthesize_inputs(definition, prefill_axes([512]), seed=1)
    for name in ("q", "k"):
        norms = inputs[name].float().norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2), name
    a = torch.exp(inputs["A_log"])
    dt = torch.nn.functional.softplus(inputs["dt_bias"])
    assert gdn.A_RANGE[0] <= float(a.min()) and float(a.max()) <= gdn.A_RANGE[1]
    assert gdn.DT_RANGE[0] * 0.99 <= float(dt.min()) and float(dt.max()) <= gdn.DT_RANGE[1] * 1.01
    outputs = run_reference(definition, inputs)
    state = outputs["new_state"]
    assert torch.isfinite(state).all() and torch.isfinite(outputs["output"].float()).all()
    assert float(state.abs().max()) < 20 * float(inputs["state"].abs().max())

    normal = dict(inputs, k=torch.randn_like(inputs["k"].float()).to(inputs["k"].dtype))
    grown = run_reference(definition, normal)["new_state"]
    assert not torch.isfinite(grown).all() or float(grown.abs().max()) > 1e6


@pytest.mark.parametrize("name, axes", [
    (DECODE, {"batch_size": 6}),
    (PREFILL, prefill_axes([1, 37, 0, 90])),  # a sequence of no tokens among them
    (PREFILL.replace("qk4_v8", "qk16_v32"), prefill_axes([17, 5])),
])
def test_the_torch_baselines_match_the_datasets_references(name, axes):
    """Every sequence and value head at once (prefill: position by position), against the
    dataset's per-sequence, per-head loops: the replay's check passes on each output."""
    definition = dataset_definition(name)
    (torch_baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    inputs = synthesize_inputs(definition, axes, seed=2)
    expected = run_reference(definition, inputs)
    found = load_function(torch_baseline.sources[0].content, "run", label=name)(**inputs)
    for output, value in zip(definition.outputs, found):
        diff = compare(value, expected[output])
        assert diff.ok, (output, diff)


def test_only_the_forms_a_baseline_computes_get_one():
    """Decode and prefill have baselines (decode also under torch.compile: no Python loop over data);
    multi-token verification (MTP), a pool of states with intermediate ones kept, has none yet: its
    reference alone replays."""
    labels = {name: {s.name.rsplit("__", 1)[1] for s in baseline_solutions(dataset_definition(name))}
              for name in (DECODE, PREFILL, MTP)}
    assert labels == {DECODE: {"torch", "torch_compile"}, PREFILL: {"torch"}, MTP: set()}


def write_dataset(root) -> None:
    """The dataset's decode, prefill and MTP files, with one workload each in its layout."""
    scale = {"type": "scalar", "value": 1 / math.sqrt(128)}
    axes = {DECODE: {"batch_size": 3}, PREFILL: prefill_axes([9, 23]), MTP: {"batch_size": 2, "seq_len": 2, "pool_size": 4}}
    (root / "definitions" / "gdn").mkdir(parents=True)
    (root / "workloads" / "gdn").mkdir(parents=True)
    for name, values in axes.items():
        definition = dataset_definition(name)
        (root / "definitions" / "gdn" / f"{name}.json").write_text(
            (FLASHINFER_TRACE / "definitions" / "gdn" / f"{name}.json").read_text())
        inputs = {n: {"type": "random"} for n, spec in definition.inputs.items() if spec.shape is not None}
        workload = {"uuid": f"{name}-0", "axes": values, "inputs": {**inputs, "scale": scale}}
        line = {"definition": name, "solution": None, "workload": workload, "evaluation": None}
        (root / "workloads" / "gdn" / f"{name}.jsonl").write_text(json.dumps(line) + "\n")


def test_the_datasets_gdn_definitions_replay_with_their_baselines(tmp_path):
    """Workloads written in flashinfer-trace's layout for the dataset's own decode and prefill
    files: the reference and the baselines all pass, and are timed."""
    write_dataset(tmp_path)
    dataset = load_dataset(tmp_path, [DECODE, PREFILL])
    results = replay(dataset, [], True, tmp_path / "results", ReplayOptions(device="cpu", max_time_s=0.01))
    by_source = {r.source: r for r in results}
    assert set(by_source) == {REFERENCE, f"{DECODE}__torch", f"{DECODE}__torch_compile", f"{PREFILL}__torch"}
    assert all(r.status.value == "passed" and r.time for r in results), [(r.source, r.error) for r in results]


def test_a_definition_only_its_reference_replays_says_so_in_the_table(tmp_path):
    """MTP has no baseline: its row of the summary read "0/0" passed and nothing else. It says that
    only the reference ran, how it fared, and why."""
    from typer.testing import CliRunner

    from fi_profile.cli import app

    write_dataset(tmp_path)
    result = CliRunner().invoke(app, ["replay", str(tmp_path), "--out", str(tmp_path / "cli"), "--device", "cpu",
                                      "--definitions", MTP, "--max-time", "0.01"], env={"COLUMNS": "200"})
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert ("no solution: only the reference ran (1/1 passed); no fi-profile baseline computes this Definition, "
            "and no Solution of it was given") in said


def test_gated_deltanets_norm_is_a_gated_rmsnorm_and_its_other_forms_are_named():
    """vLLM's ``RMSNormGated`` as Qwen3-Next builds it (SiLU gate after the norm, over each value
    head) is ``gated_rmsnorm_h{D}``, whose baseline matches its reference; the forms it does not
    compute (the gate before the norm, as Mamba-2's norm has it; groups; a sigmoid gate) are listed
    by name, never recorded as it."""
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNormGated

    from fi_profile.families import rmsnorm

    def gated(**kwargs):
        with set_current_vllm_config(VllmConfig()):  # vLLM's layers are built under a config
            return RMSNormGated(64, eps=1e-6, **{"norm_before_gate": True, "activation": "silu", **kwargs})

    layer = gated()
    assert rmsnorm.gated_layer_problem(layer) is None
    x = torch.randn(6, 4, 64, dtype=torch.bfloat16)
    (called,) = rmsnorm.gated_layer_calls(layer, x, torch.randn_like(x))
    assert called.definition.name == "gated_rmsnorm_h64" and called.axes == {"batch_size": 24}
    for kwargs, said in (({"norm_before_gate": False}, "the gate before the norm (norm_before_gate=False)"),
                         ({"group_size": 16}, "groups of 16"), ({"activation": "sigmoid"}, "a sigmoid gate")):
        problem = rmsnorm.gated_layer_problem(gated(**kwargs))
        assert problem == f"RMSNormGated with {said} (no Definition computes it)"
    definition = called.definition
    (torch_baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    inputs = synthesize_inputs(definition, {"batch_size": 24}, seed=3)
    expected = run_reference(definition, inputs)["output"]
    found = load_function(torch_baseline.sources[0].content, "run", label=definition.name)(**inputs)
    assert compare(found, expected).ok
    with torch.no_grad():
        layer.weight.copy_(inputs["weight"].to(layer.weight.dtype))
        native = layer.forward_native(inputs["hidden_states"], inputs["gate"])  # vLLM's own PyTorch form
    assert compare(native.to(expected.dtype), expected).ok


def test_a_state_is_judged_at_the_activations_precision():
    """A chunked prefill rounds its chunk-to-chunk products to bfloat16 (flash-linear-attention's:
    its state off by ~1e-3 at magnitude 4.6 on float16 inputs, under Triton's interpreter), and
    SGLang's packed decode rounds its update's gate ``sigmoid(b)`` to bfloat16 (0.0025 off at
    magnitude 5 on an H100), which the float32 reference does not: a prefill's state is judged at
    bfloat16's precision times its largest magnitude (its products compound over the chunks), a
    decode step's at bfloat16's precision."""
    from fi_profile.catalog import shipped_definition

    family = gdn.FAMILY
    prefill, decode = (shipped_definition(f"gdn_{kind}_qk4_v8_d128_k_last") for kind in ("prefill", "decode"))
    assert family.rounds_through(prefill) is torch.bfloat16 and family.rounds_through(decode) is torch.bfloat16
    assert family.checks_atol_of_largest(prefill) and not family.checks_atol_of_largest(decode)
    state = torch.randn(3, 8, 128, 128) * 1.5
    off = state + 2e-3 * torch.randn_like(state).sign()
    assert compare(off, state, True, family.rounds_through(prefill)).ok
    assert compare(off, state, False, family.rounds_through(decode)).ok
    assert not compare(state + 6e-3 * torch.randn_like(state).sign(), state, False, family.rounds_through(decode)).ok


def test_sglangs_decode_gate_rounding_passes_the_check():
    """The reference's decode with its gate ``sigmoid(b)`` rounded to bfloat16 (as SGLang's packed
    decode kernel computes it) passes the family's check; a gate off by 0.5% does not."""
    import importlib.util
    from pathlib import Path

    from fi_profile.catalog import shipped_definition
    from fi_profile.synthesis import synthesize_inputs

    definition = shipped_definition("gdn_decode_qk4_v8_d128_k_last")
    inputs = synthesize_inputs(definition, {"batch_size": 8}, seed=1)
    path = Path(gdn.__file__).parent / "torch_gdn_decode.py"
    spec = importlib.util.spec_from_file_location("torch_gdn_decode_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, expected = module.run(**inputs)
    sigmoid = torch.sigmoid
    family = gdn.FAMILY
    for error, passes in ((None, True), (0.005, False)):
        module.torch.sigmoid = (lambda x: sigmoid(x).to(torch.bfloat16).float()) if error is None \
            else (lambda x, e=error: sigmoid(x) * (1 + e))
        try:
            _, found = module.run(**inputs)
        finally:
            module.torch.sigmoid = sigmoid
        assert compare(found, expected, False, family.rounds_through(definition)).ok is passes


def test_a_chunked_prefill_s_output_is_judged_at_its_state_s_magnitude():
    """vLLM 0.26's FLA prefill on an H100 (Qwen3-Next at TP=4): 1 of 2.3M outputs 0.0103 off where
    the reference is 7e-6, beyond bfloat16's atol of 0.01 (the outputs' largest magnitude is below
    1): each chunk's output is read from its chunk-start state rounded to bfloat16, whose magnitude
    is the state's. The replay's check scales the output's atol by the state's largest magnitude."""
    from fi_profile.catalog import shipped_definition
    from fi_profile.replay.evaluate import _diff_all

    prefill, decode = (shipped_definition(f"gdn_{kind}_qk4_v8_d128_k_last") for kind in ("prefill", "decode"))
    assert gdn.FAMILY.atol_scaled_by(prefill) == {"output": "new_state"} and gdn.FAMILY.atol_scaled_by(decode) == {}
    output = (torch.rand(64, 8, 128) - 0.5).to(torch.bfloat16)
    state = torch.randn(2, 8, 128, 128) * 1.5
    off = output.clone()
    off[0, 0, 0] += 0.0103
    reference = {"output": output, "new_state": state}
    assert _diff_all(prefill, {"output": off, "new_state": state}, reference).ok
    off[0, 0, 0] += 0.5  # a wrong output is still one
    assert not _diff_all(prefill, {"output": off, "new_state": state}, reference).ok
