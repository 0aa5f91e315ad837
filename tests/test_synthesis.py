import json
import math
import warnings

import pytest
import torch
from conftest import flashinfer_definitions
from safetensors.torch import save_file

from fi_profile.binding import bind_axes, failed_constraints, logical_shape
from fi_profile.catalog import shipped_definition, shipped_definitions
from fi_profile.entry_points import run_reference
from fi_profile.schema import Definition, Trace
from fi_profile.schema.dtype import torch_dtype
from fi_profile.synthesis import SynthesisError, small_axes, synthesize_inputs
from fi_profile.workload_inputs import workload_inputs

SHIPPED_OP_TYPES = {d.op_type for d in shipped_definitions().values()}


def _nan(value: torch.Tensor) -> torch.Tensor:
    """Where ``value`` holds a NaN, or an infinity other than -inf (the lse of an empty row). One-byte
    floats are read in float32 first, which maps their NaN encodings (e4m3's 0x7F / 0xFF, e5m2's,
    e8m0's 0xFF) to NaN; FP4 (e2m1) has no NaN or infinity to find."""
    if value.dtype in FP4_DTYPES:
        return torch.zeros((), dtype=torch.bool)
    wide = value.float() if value.element_size() == 1 else value
    return ~(torch.isfinite(wide) | (wide == float("-inf")))


FP4_DTYPES = tuple(getattr(torch, name) for name in ("float4_e2m1fn_x2",) if hasattr(torch, name))


def test_nan_encodings_of_one_byte_floats_are_found():
    """FP8 outputs were never checked: the check skipped one-byte dtypes."""
    nan_e4m3 = torch.tensor([0x7F, 0x00, 0xFF], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert _nan(nan_e4m3).tolist() == [True, False, True]
    assert not _nan(torch.tensor([1.0, -2.0]).to(torch.float8_e4m3fn)).any()
    assert _nan(torch.tensor([float("nan"), float("-inf"), float("inf")])).tolist() == [True, False, True]


def check_runs(definition: Definition, axes: dict[str, int], **kwargs) -> dict:
    inputs = synthesize_inputs(definition, axes, **kwargs)
    assert bind_axes(definition, inputs) == axes
    assert failed_constraints(definition, axes, inputs) == []
    outputs = run_reference(definition, inputs)
    full_axes = definition.axis_values(axes)
    for name, spec in definition.outputs.items():
        value = outputs[name]
        if spec.shape is None:
            continue
        assert logical_shape(value, spec) == definition.shape_of(spec, full_axes), name
        assert value.dtype == torch_dtype(spec.dtype), name
        if value.dtype.is_floating_point:
            assert not bool(_nan(value).any()), f"{definition.name}.{name} has NaN"
    return inputs


#: large MoE definitions (flashinfer's, DeepSeek-V3's shipped one) hold whole expert weight sets:
#: tens of GiB on CPU (their references are tested at small widths where their families are)
CPU_INPUT_BUDGET = 1 << 30


def input_bytes(definition: Definition, axes: dict[str, int]) -> int:
    full = definition.axis_values(axes)
    return sum(
        math.prod(definition.shape_of(spec, full)) * torch.empty(0, dtype=torch_dtype(spec.dtype)).element_size()
        for spec in definition.inputs.values()
        if spec.shape is not None
    )


#: the shipped templates run up to Mixtral-8x7B's experts (2.6 GiB), not DeepSeek-V3's (21 GiB);
#: flashinfer-trace's under the same budget (its FP8 block-scale MoE of 1.3-2.3 GiB). Measured on
#: the 23 GB CI-like host: the shipped ones peak at 21.5 GB resident, flashinfer's at 18-21.5 GB
SHIPPED_INPUT_BUDGET = 4 << 30


def within_cpu_budget(definition: Definition, budget: int = CPU_INPUT_BUDGET):
    size = input_bytes(definition, small_axes(definition))
    marks = () if size <= budget else pytest.mark.skip(reason=f"inputs alone take {size / 2**30:.1f} GiB")
    return pytest.param(definition, id=definition.name, marks=marks)


@pytest.mark.parametrize("definition", [within_cpu_budget(d, SHIPPED_INPUT_BUDGET) for d in shipped_definitions().values()])
def test_shipped_references_run_on_synthesized_inputs(definition):
    check_runs(definition, small_axes(definition))


@pytest.mark.parametrize(
    "definition", [within_cpu_budget(d, SHIPPED_INPUT_BUDGET) for d in flashinfer_definitions() if d.op_type in SHIPPED_OP_TYPES]
)
def test_flashinfer_references_of_shipped_op_types_run(definition):
    check_runs(definition, small_axes(definition))


def test_paged_prefill_layout_is_valid_and_causal():
    definition = shipped_definition("gqa_paged_prefill_causal_h32_kv8_d128_ps16")
    axes = {"batch_size": 3, "len_indptr": 4, "total_q": 20, "num_kv_indices": 9, "num_pages": 40}
    for seed in range(20):
        inputs = check_runs(definition, axes, seed=seed)
        qo, kv, last = inputs["qo_indptr"], inputs["kv_indptr"], inputs["kv_last_page_len"]
        assert qo[0] == 0 and qo[-1] == 20 and bool((qo.diff() >= 0).all())
        assert kv[0] == 0 and kv[-1] == 9 and bool((kv.diff() >= 1).all())
        indices = inputs["kv_indices"]
        assert len(set(indices.tolist())) == 9 and int(indices.max()) < 40 and int(indices.min()) >= 0
        assert bool(((last >= 1) & (last <= 16)).all())
        kv_tokens = (kv.diff() - 1) * 16 + last
        assert bool((kv_tokens >= qo.diff()).all()), "every sequence has at least its queries in KV"


def test_ragged_prefill_kv_at_least_q():
    definition = shipped_definition("gqa_ragged_prefill_causal_h32_kv8_d128")
    axes = {"len_indptr": 5, "total_q": 12, "total_kv": 30}
    inputs = check_runs(definition, axes)
    assert bool((inputs["kv_indptr"].diff() >= inputs["qo_indptr"].diff()).all())


def test_given_tensors_take_precedence_and_rest_agrees():
    definition = shipped_definition("gqa_paged_decode_h32_kv8_d128_ps16")
    kv_indptr = torch.tensor([0, 1, 4], dtype=torch.int32)
    axes = {"batch_size": 2, "len_indptr": 3, "num_kv_indices": 4, "num_pages": 8}
    inputs = check_runs(definition, axes, given={"kv_indptr": kv_indptr}, scalars={"sm_scale": 0.5})
    assert inputs["kv_indptr"] is kv_indptr or torch.equal(inputs["kv_indptr"], kv_indptr)
    assert inputs["sm_scale"] == 0.5


def test_unsatisfiable_axes_raise():
    definition = shipped_definition("gqa_paged_decode_h32_kv8_d128_ps1")
    with pytest.raises(SynthesisError, match="num_pages is 2"):
        synthesize_inputs(definition, {"batch_size": 2, "len_indptr": 3, "num_kv_indices": 6, "num_pages": 2})
    with pytest.raises(SynthesisError, match="no value for var axes"):
        synthesize_inputs(definition, {"batch_size": 2})


def test_seed_decides_data():
    definition = shipped_definition("rmsnorm_h4096")
    a = synthesize_inputs(definition, {"batch_size": 2}, seed=1)["hidden_states"]
    b = synthesize_inputs(definition, {"batch_size": 2}, seed=1)["hidden_states"]
    c = synthesize_inputs(definition, {"batch_size": 2}, seed=2)["hidden_states"]
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1", "int8", "bool", "float16"])
def test_every_dtype_synthesizes(dtype):
    definition = Definition.model_validate(
        {
            "name": f"copy_{dtype}",
            "op_type": "copy",
            "axes": {"M": {"type": "var"}, "K": {"type": "const", "value": 16}},
            "inputs": {"x": {"shape": ["M", "K"], "dtype": dtype}},
            "outputs": {"y": {"shape": ["M", "K"], "dtype": dtype}},
            "reference": "def run(x):\n    return x.clone()\n",
        }
    )
    check_runs(definition, {"M": 3})


def test_sampling_inputs_are_distributions():
    definition = shipped_definition("top_k_top_p_sampling_from_probs_v128256")
    inputs = check_runs(definition, {"batch_size": 3})
    assert torch.allclose(inputs["probs"].sum(-1), torch.ones(3), atol=1e-4)
    assert bool((inputs["top_k"] >= 1).all()) and bool(((inputs["top_p"] > 0) & (inputs["top_p"] <= 1)).all())


def test_workload_uses_captured_tensor_and_falls_back_with_warning(tmp_path):
    definition = shipped_definition("gqa_paged_decode_h32_kv8_d128_ps1")
    blob = tmp_path / "blob" / "w.safetensors"
    blob.parent.mkdir()
    save_file({"kv_indptr": torch.tensor([0, 2, 5], dtype=torch.int32)}, str(blob))
    line = {
        "definition": definition.name,
        "solution": None,
        "evaluation": None,
        "workload": {
            "uuid": "u1",
            "axes": {"batch_size": 2, "num_pages": 9, "len_indptr": 3, "num_kv_indices": 5},
            "inputs": {
                "q": {"type": "random"},
                "k_cache": {"type": "random"},
                "v_cache": {"type": "random"},
                "kv_indptr": {"type": "safetensors", "path": "blob/w.safetensors", "tensor_key": "kv_indptr"},
                "kv_indices": {"type": "safetensors", "path": "blob/gone.safetensors", "tensor_key": "kv_indices"},
                "sm_scale": {"type": "scalar", "value": 0.125},
            },
        },
    }
    trace = Trace.model_validate_json(json.dumps(line))
    with pytest.warns(UserWarning, match="gone.safetensors is missing"):
        inputs = workload_inputs(definition, trace.workload, tmp_path)
    assert inputs["kv_indptr"].tolist() == [0, 2, 5]
    assert inputs["sm_scale"] == 0.125
    assert len(set(inputs["kv_indices"].tolist())) == 5


def test_flashinfer_workloads_of_shipped_op_types_materialize(flashinfer_trace):
    """Workload lines become valid inputs and the small ones run their reference.

    Lines whose tensors would pass 64 MiB are left to the GPU replay (2 CPU cores here). Some
    lines of the data set are impossible as written (``num_pages`` below the number of page ids,
    e.g. 0 pages for 2 ids): synthesis must refuse exactly those, saying why.
    """
    definitions = {d.name: d for d in flashinfer_definitions()}
    materialized, ran, refused = 0, 0, []
    for path in sorted((flashinfer_trace / "workloads").glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            trace = Trace.model_validate_json(line)
            definition = definitions[trace.definition]
            if definition.op_type not in SHIPPED_OP_TYPES or _bytes(definition, trace.workload.axes) > 2**26:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the blobs are not in the data set
                    inputs = workload_inputs(definition, trace.workload, flashinfer_trace)
            except SynthesisError as exc:
                refused.append((trace.workload.axes, str(exc)))
                continue
            materialized += 1
            assert bind_axes(definition, inputs) == trace.workload.axes
            assert failed_constraints(definition, trace.workload.axes, inputs) == []
            if max(trace.workload.axes.values()) <= 64 and definition.op_type != "gemm":
                run_reference(definition, inputs)
                ran += 1
    assert refused == [
        (axes, f"{axes['num_kv_indices']} unique page ids are needed but num_pages is {axes['num_pages']}")
        for axes, _ in refused
    ]
    assert refused and all(axes["num_pages"] < axes["num_kv_indices"] for axes, _ in refused)
    assert materialized > 300 and ran > 20


def _bytes(definition: Definition, var_axes: dict[str, int]) -> int:
    axes = definition.axis_values(var_axes)
    total = 0
    for spec in definition.inputs.values():
        shape = definition.shape_of(spec, axes) or ()
        total += int(torch.tensor(shape, dtype=torch.float64).prod()) * torch_dtype(spec.dtype).itemsize
    return total


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("definition", list(shipped_definitions().values()), ids=lambda d: d.name)
def test_shipped_references_run_on_cuda(definition):
    inputs = check_runs(definition, small_axes(definition), device="cuda")
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "cuda" for t in tensors)


def test_a_large_normal_tensor_is_drawn_a_slice_at_a_time_in_its_own_dtype(monkeypatch):
    """DeepSeek-V3's expert weights are 15 GiB in bf16: drawn whole in float32 first they took 28
    GiB more (an out-of-memory seen on an H100). Above the slice size, each slice of the first
    dimension is drawn on its own; the values keep their scale."""
    from fi_profile.synthesis import values

    monkeypatch.setattr(values, "_SLICE", 1000)
    drawn = values._normal((40, 300), torch.Generator().manual_seed(0), torch.device("cpu"), torch.bfloat16, 0.5)
    assert drawn.dtype == torch.bfloat16 and drawn.shape == (40, 300)
    assert abs(float(drawn.float().std()) - 0.5) < 0.02
    assert all(float(row.float().abs().sum()) > 0 for row in drawn)  # every slice drawn, none left empty
    assert not torch.equal(drawn[:3], drawn[3:6])  # slices are not the same draw


def _fixture_definition(path: str) -> Definition:
    import json
    from pathlib import Path

    return Definition.model_validate(json.loads(
        (Path(__file__).parent / "fixtures" / "flashinfer-trace" / "definitions" / f"{path}.json").read_text()))


@pytest.mark.parametrize("path, name", [("mamba_ssu/mamba_ssu_decode_h64_d64_s128_ng4", "state_batch_indices"),
                                        ("gdn/gdn_mtp_qk4_v8_d128_k_last", "initial_state_indices")])
def test_each_request_gets_a_slot_of_its_own_in_a_state_pool(path, name):
    """Mamba's SSU and the GDN MTP step index a pool of states per request. Synthesized as zeros,
    every request shared slot 0: a kernel's writes raced and its reads hit one cache line."""
    definition = _fixture_definition(path)
    axes = {**small_axes(definition), "batch_size": 4}
    pool = next(a for a in ("state_cache_size", "pool_size") if a in definition.var_axes)
    axes[pool] = 9
    slots = check_runs(definition, axes)[name]
    assert len(set(slots.tolist())) == 4 and 0 <= int(slots.min()) and int(slots.max()) < 9


def test_sparse_attention_tokens_pick_distinct_keys_of_the_cache():
    """DeepSeek-V3.2's sparse attention reads each token's top-k keys by index (``page * 64 +
    offset``). Synthesized as zeros, every token attended to key 0 2,048 times; now each picks
    distinct keys of the cache, and ``-1`` (padding) past its size, and the reference runs."""
    definition = _fixture_definition("dsa_paged/dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64")
    for pages in (8, 40):  # fewer keys than top-k (512): padded; more (2,560): none
        indices = check_runs(definition, {"num_tokens": 3, "num_pages": pages})["sparse_indices"]
        for row in indices.tolist():
            picked = [i for i in row if i != -1]
            assert len(picked) == min(2048, pages * 64) == len(set(picked)) and max(picked) < pages * 64
            assert row[len(picked):] == [-1] * (2048 - len(picked))


def test_the_dsa_indexers_requests_read_pages_of_their_own():
    """DeepSeek-V3.2's FP8 indexer reads each request's pages through its block table, as long
    as its length. Synthesized as zeros and ones, every request was one token long on page 0."""
    definition = _fixture_definition("dsa_paged/dsa_topk_indexer_fp8_h64_d128_topk2048_ps64")
    inputs = check_runs(definition, {"batch_size": 2, "max_num_pages": 40, "num_pages": 100})
    table, lengths = inputs["block_table"], inputs["seq_lens"]
    assert len(set(table.flatten().tolist())) == 80 and int(table.max()) < 100
    assert all(1 <= n <= 40 * 64 for n in lengths.tolist()) and len(set(lengths.tolist())) == 2
