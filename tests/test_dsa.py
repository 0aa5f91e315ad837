"""DeepSeek-V3.2's sparse attention: flashinfer-trace's ``dsa_*`` Definitions shipped unchanged,
their PyTorch baselines against the references on synthesized inputs, the indexer's top-k judged as
sets per request, and a replay of all three on CPU."""

from __future__ import annotations

import json

import pytest
import torch
from test_replay import run_replay, write_workloads

from fi_profile.catalog import shipped_definition
from fi_profile.entry_points import load_function, run_reference
from fi_profile.families import dsa, family_of
from fi_profile.replay.baseline_solutions import baseline_solutions
from fi_profile.replay.check import SET_MISMATCH, compare, compare_sets
from fi_profile.replay.runner import REFERENCE
from fi_profile.synthesis import synthesize_inputs

INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
SPARSE = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
SPARSE_PS1 = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1"
#: small workloads: fewer keys than the top-k (padded) and more (none padded)
AXES = {
    INDEXER: {"batch_size": 3, "max_num_pages": 40, "num_pages": 130},
    SPARSE: {"num_tokens": 3, "num_pages": 40},
    SPARSE_PS1: {"num_tokens": 2, "num_pages": 1500},
}


def _torch_run(definition):
    torch_solution = next(s for s in baseline_solutions(definition) if s.name.endswith("__torch"))
    return load_function(torch_solution.sources[0].content, "run", label=definition.name)


def test_the_datasets_definitions_are_shipped_unchanged(flashinfer_trace):
    for name in AXES:
        shipped = shipped_definition(name)
        theirs = json.loads((flashinfer_trace / "definitions" / "dsa_paged" / f"{name}.json").read_text())
        assert shipped is not None and shipped.op_type == "dsa_paged" and family_of("dsa_paged") is dsa.FAMILY
        assert shipped.reference == theirs["reference"] and set(shipped.inputs) == set(theirs["inputs"])


@pytest.mark.parametrize("name", [SPARSE, SPARSE_PS1])
def test_the_sparse_attention_baseline_matches_the_reference(name):
    definition = shipped_definition(name)
    inputs = synthesize_inputs(definition, AXES[name], seed=3)
    inputs["sparse_indices"][1, 100:] = -1  # a token with fewer keys than the top-k
    inputs["sparse_indices"][0, :] = -1  # and one with none: zeros and -inf
    inputs["sm_scale"] = 192 ** -0.5
    expected = run_reference(definition, inputs)
    output, lse = _torch_run(definition)(**inputs)
    assert compare(output, expected["output"]).ok and compare(lse, expected["lse"]).ok
    assert bool((output[0] == 0).all()) and bool((lse[0] == -torch.inf).all())
    assert bool(torch.isfinite(lse[1:]).all())


def test_the_indexer_baseline_selects_the_references_tokens():
    definition = shipped_definition(INDEXER)
    inputs = synthesize_inputs(definition, AXES[INDEXER], seed=4)
    inputs["seq_lens"] = torch.tensor([1000, 2560, 2049], dtype=torch.int32)  # under, over and past the top-k
    (expected,) = run_reference(definition, inputs).values()
    (ours,) = _torch_run(definition)(**inputs)
    assert compare_sets(ours, expected).ok
    assert int((expected[0] == -1).sum()) == 2048 - 1000 and int((ours[0] == -1).sum()) == 2048 - 1000
    assert not bool((ours[1] == -1).any())  # no padding where the request holds more than the top-k
    assert dsa.unordered_rows(definition) == ("topk_indices",)
    assert dsa.unordered_rows(shipped_definition(SPARSE)) == ()


def test_a_top_k_is_judged_as_a_set_per_row():
    reference = torch.stack([torch.randperm(5000)[:2048] for _ in range(2)]).to(torch.int32)
    shuffled = reference[:, torch.randperm(2048)]
    assert compare_sets(shuffled, reference).mismatched == 0  # any order
    assert not compare(shuffled, reference).ok  # which the elementwise check refuses
    tie = shuffled.clone()
    tie[0, 0] = 4999 if 4999 not in reference[0] else 5001  # one token swapped at the boundary
    assert compare_sets(tie, reference).mismatched == 1 and compare_sets(tie, reference).ok
    wrong = reference.clone()
    wrong[1, : int(SET_MISMATCH * 4096) + 2] = -1  # more than the allowance: wrong
    diff = compare_sets(wrong, reference)
    assert not diff.ok and diff.method == "sets"
    assert not compare_sets(reference[:, :100], reference).ok  # another shape


def test_the_three_definitions_replay_on_cpu(tmp_path):
    entries = [(shipped_definition(name), axes, {"sm_scale": 192 ** -0.5}) for name, axes in AXES.items()]
    write_workloads(tmp_path / "data", entries)
    _, results = run_replay(tmp_path / "data", tmp_path / "out", [], timeout_s=300)
    assert {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    sources = {(r.kernel_id, r.source) for r in results}
    for name in AXES:
        assert {(name, REFERENCE), (name, f"{name}__torch")} <= sources
    assert (INDEXER, f"{INDEXER}__torch_compile") in sources
    indexer = [r for r in results if r.kernel_id == INDEXER and r.source != REFERENCE]
    assert indexer and all(r.check.method == "sets" for r in indexer)
