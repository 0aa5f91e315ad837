"""FP8 linear layers on CPU (issue 24's Definitions; no engine here runs them without AMX): block
scale, and per-tensor / per-token-and-channel scaled. The activation quantizations and the GEMM
references against independent
computations, valid FP8 inputs of realistic magnitude, the names a layer's calls get, and a replay
of small shapes in which the references and PyTorch baselines pass the FP8 tolerances."""

import json

import pytest
import torch
from test_replay import run_replay

from fi_profile.catalog import shipped_definition
from fi_profile.entry_points import run_reference
from fi_profile.families import fp8_linear
from fi_profile.replay.baseline_solutions import native_candidates
from fi_profile.schema.dtype import DType
from fi_profile.synthesis import synthesize_inputs

QUANT, GEMM = "quant_fp8_per_token_group_k7168_g128", "gemm_fp8_block_scale_n7168_k2048"
FP8_MAX = 448.0


def test_quantization_reference_scales_each_token_group_to_the_fp8_range():
    """Every group's largest value lands on 448 exactly, the scale is its magnitude / 448, and each
    value comes back within e4m3's rounding (3 mantissa bits: half a step is 1/16 of it)."""
    definition = shipped_definition(QUANT)
    x = torch.randn(5, 7168, dtype=torch.float32).mul(torch.rand(5, 1) * 10).to(torch.bfloat16)
    x[0, :128] = 0  # an all-zero group: the smallest scale, no division by zero
    out = run_reference(definition, {"x": x})
    x_q, scale = out["x_q"], out["x_scale"]
    assert x_q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (5, 56)
    groups = x.float().view(5, 56, 128)
    assert torch.equal(scale, groups.abs().amax(-1).clamp_min(1e-10) / FP8_MAX)
    deq = x_q.float().view(5, 56, 128) * scale.unsqueeze(-1)
    assert not torch.isnan(x_q.float()).any() and torch.equal(x_q.float().view(5, 56, 128)[0, 0], torch.zeros(128))
    assert (x_q.float().view(5, 56, 128)[1:].abs().amax(-1) == FP8_MAX).all()
    assert ((deq - groups).abs() <= groups.abs() / 16 + scale.unsqueeze(-1) * 2 ** -9).all()


def test_power_of_two_quantization_rounds_each_scale_up_to_a_power_of_two():
    """DeepGEMM's UE8M0 scales: each group's scale is the least power of two at or above its
    magnitude / 448, so no value leaves e4m3's range and the largest lands within a factor 2 of 448."""
    x = torch.randn(5, 512, dtype=torch.float32).mul(torch.rand(5, 1) * 10).to(torch.bfloat16)
    call = fp8_linear.quant_call(5, 512, 128, torch.bfloat16, power_of_two=True)
    assert call.definition.name == "quant_fp8_per_token_group_ue8m0_k512_g128"
    out = run_reference(call.definition, {"x": x})
    groups = x.float().view(5, 4, 128)
    exact = groups.abs().amax(-1).clamp_min(1e-10) / FP8_MAX
    assert torch.equal(out["x_scale"], torch.exp2(torch.ceil(torch.log2(exact))))
    assert (out["x_scale"] >= exact).all() and (out["x_scale"] < 2 * exact).all()
    largest = out["x_q"].float().view(5, 4, 128).abs().amax(-1)
    assert (largest <= FP8_MAX).all() and (largest >= FP8_MAX / 2 - 16).all()
    plain = run_reference(fp8_linear.quant_call(5, 512, 128, torch.bfloat16).definition, {"x": x})
    assert not torch.equal(plain["x_scale"], out["x_scale"])


def test_block_gemm_reference_is_the_product_of_the_dequantized_operands():
    """C = (A * its token-group scales) @ (B * its 128x128 block scales).T, computed here in float64
    from the block structure written out; a weight whose N and K are not multiples of the block
    (the last blocks partial) too."""
    call = fp8_linear.block_gemm_call(3, 200, 320, (128, 128), torch.bfloat16)
    definition = call.definition
    assert definition.name == "gemm_fp8_block_scale_n200_k320"
    assert definition.const_axes == {"N": 200, "K": 320, "num_n_blocks": 2, "num_k_blocks": 3}
    inputs = synthesize_inputs(definition, {"M": 3}, seed=1)
    out = run_reference(definition, inputs)["C"]
    a, b = inputs["A"].double(), inputs["B"].double()
    for k in range(3):  # K blocks: 128, 128, 64
        a[:, k * 128:(k + 1) * 128] *= inputs["A_scale"][:, k : k + 1].double()
        for j in range(2):  # N blocks: 128, 72
            b[j * 128:(j + 1) * 128, k * 128:(k + 1) * 128] *= float(inputs["B_scale"][j, k])
    exact = a @ b.T
    assert out.dtype == torch.bfloat16 and torch.allclose(out.double(), exact, rtol=8e-3, atol=1e-2 * float(exact.abs().max()))


def test_fp8_inputs_are_valid_and_dequantize_to_model_magnitudes():
    """No NaN encodings; quantized data spans e4m3's range; scales make the dequantized activations
    O(1) and the weight's O(1/sqrt(K)), so the GEMM's output is O(1) as in a model."""
    definition = fp8_linear.block_gemm_call(4, 512, 1024, (128, 128), torch.bfloat16).definition
    inputs = synthesize_inputs(definition, {"M": 4}, seed=0)
    for name in ("A", "B"):
        values = inputs[name].float()
        assert not torch.isnan(values).any() and values.abs().max() <= FP8_MAX and values.abs().max() > 200
    a = inputs["A"].float() * inputs["A_scale"].repeat_interleave(128, dim=1)
    b = inputs["B"].float() * inputs["B_scale"].repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    assert 0.5 < float(a.std()) < 2 and 0.5 < float(b.std()) * 1024 ** 0.5 < 2
    assert 0.3 < float(run_reference(definition, inputs)["C"].float().std()) < 3


def test_a_layers_calls_are_its_quantization_then_its_gemm():
    """An FP8 block-scale linear layer: the per-token-group quantization of its input (groups of the
    weight block's K), then the GEMM; another block shape is in the name; a layer whose input comes
    quantized runs the GEMM alone."""
    x = torch.zeros(6, 256, dtype=torch.bfloat16)
    quant, gemm = fp8_linear.block_linear_calls(x, 512, 256, (128, 128))
    assert quant.definition.name == "quant_fp8_per_token_group_k256_g128" and quant.axes == {"M": 6}
    assert gemm.definition.name == "gemm_fp8_block_scale_n512_k256" and gemm.axes == {"M": 6}
    assert "GROUP_SIZE = 128" in quant.definition.reference and quant.definition.const_axes["num_groups"] == 2
    (only,) = fp8_linear.block_linear_calls(x, 512, 256, (64, 64), quantized_here=False)
    assert only.definition.name == "gemm_fp8_block_scale_n512_k256_b64x64"
    assert "BLOCK_N = 64" in only.definition.reference and only.definition.const_axes["num_k_blocks"] == 4
    assert only.definition.inputs["A"].dtype is DType.float8_e4m3fn
    # vLLM's and SGLang's Triton block-FP8 GEMMs serve every block shape: the Definition's block set
    # in their sources; vLLM's CUTLASS one takes 128 x 128 blocks only
    from fi_profile.replay.baseline_solutions import native_solution

    natives = native_candidates(only.definition)
    assert [native.label for _, native in natives] == ["vllm_triton", "sglang_triton"]
    for family, native in natives:
        source = native_solution(only.definition, family, native).sources[0].content
        assert "BLOCK_N = 64" in source and "BLOCK_K = 64" in source
    assert [n.label for _, n in native_candidates(gemm.definition)] == ["vllm_triton", "sglang_triton", "vllm_cutlass"]
    # the quantization before it: SGLang's, with the Definition's group size, where its scales are float32
    ((family, native),) = native_candidates(quant.definition)
    assert native.library == "sglang" and "GROUP_SIZE = 128" in native_solution(quant.definition, family,
                                                                            native).sources[0].content
    power_of_two = fp8_linear.quant_call(6, 256, 128, torch.bfloat16, power_of_two=True).definition
    assert native_candidates(power_of_two) == []


def test_small_fp8_definitions_replay_with_their_baselines_on_cpu(tmp_path):
    """The references and PyTorch baselines of both op types (the quantization with float32 and
    power-of-two scales) pass on CPU at small shapes, under the
    FP8 GEMM's tolerance (bfloat16's, its atol relative to the output's largest magnitude)."""
    definitions = [fp8_linear.quant_call(1, 512, 128, torch.bfloat16).definition,
                   fp8_linear.quant_call(1, 512, 128, torch.bfloat16, power_of_two=True).definition,
                   fp8_linear.block_gemm_call(1, 384, 512, (128, 128), torch.bfloat16).definition]
    for definition in definitions:
        folder = tmp_path / "definitions" / definition.op_type
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{definition.name}.json").write_text(definition.to_json())
        workloads = tmp_path / "workloads" / definition.op_type
        workloads.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"definition": definition.name, "workload": {
            "uuid": f"{definition.name}-{m}", "axes": {"M": m}, "inputs": {n: {"type": "random"} for n in definition.inputs}}})
            for m in (3, 17)]
        (workloads / f"{definition.name}.jsonl").write_text("\n".join(lines) + "\n")
    _, results = run_replay(tmp_path, tmp_path / "out", [], timeout_s=300)
    assert {r.kernel_id for r in results} == {d.name for d in definitions}
    assert {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    assert {r.source.rsplit("__", 1)[-1] for r in results} >= {"torch"}


def test_dynamic_per_tensor_and_per_token_quantization_map_the_largest_magnitude_to_448():
    """Per tensor: one 0-D scale, the tensor's largest magnitude lands on 448. Per token: one scale
    per row, each row's largest lands on 448; values come back within e4m3's rounding."""
    x = torch.randn(6, 4096, dtype=torch.float32).mul(torch.rand(6, 1) * 10).to(torch.bfloat16)
    per_tensor = run_reference(shipped_definition("quant_fp8_per_tensor_k4096"), {"x": x})
    assert per_tensor["x_scale"].shape == () and per_tensor["x_q"].dtype == torch.float8_e4m3fn
    assert torch.equal(per_tensor["x_scale"], x.float().abs().amax() / FP8_MAX)
    assert per_tensor["x_q"].float().abs().amax() == FP8_MAX
    per_token = run_reference(shipped_definition("quant_fp8_per_token_k4096"), {"x": x})
    assert per_token["x_scale"].shape == (6,)
    assert (per_token["x_q"].float().abs().amax(-1) == FP8_MAX).all()
    back = per_token["x_q"].float() * per_token["x_scale"][:, None]
    assert ((back - x.float()).abs() <= x.float().abs() / 16 + per_token["x_scale"][:, None] / 512).all()


def test_scaled_fp8_gemm_references_dequantize_by_tensor_or_by_token_and_channel():
    """The scaled GEMM's reference is one formula for every scale layout (activations per tensor or
    per token, weights per tensor or per channel, the mixed ones vLLM and compressed-tensors run
    too): against float64 dequantized operands; vLLM's CUTLASS scaled-mm is offered for every
    layout, SGLang's (sgl-kernel's) for the per-token / per-channel one it runs, ``torch._scaled_mm``
    where both scales are of one kind; another layout is refused by name."""
    for activation, weight, name in (("tensor", "tensor", "per_tensor"), ("token", "channel", "per_token_channel"),
                                     ("token", "tensor", "per_token_tensor"), ("tensor", "channel", "per_tensor_channel")):
        (quant, gemm_call) = fp8_linear.scaled_linear_calls(torch.zeros(5, 256, dtype=torch.bfloat16), 384, 256,
                                                             activation, weight)
        assert quant.definition.op_type == f"quant_fp8_per_{activation}"
        definition = gemm_call.definition
        assert definition.name == f"gemm_fp8_{name}_scale_n384_k256"
        assert [n.label for _, n in native_candidates(definition)] == ["vllm_cutlass"] + (
            ["sglang_cutlass"] if (activation, weight) == ("token", "channel") else []) + (
            ["torch_scaled_mm"] if (activation == "tensor") == (weight == "tensor") else [])
        inputs = synthesize_inputs(definition, {"M": 5}, seed=2)
        a = inputs["A"].double() * inputs["A_scale"].double().reshape(-1, 1)
        b = inputs["B"].double() * inputs["B_scale"].double().reshape(-1, 1)
        assert 0.3 < a.std() < 3 and 0.3 < b.std() * 256 ** 0.5 < 3  # model magnitudes after dequantization
        out = run_reference(definition, inputs)["C"]
        torch.testing.assert_close(out.double(), a @ b.T, atol=2e-2, rtol=1.6e-2)
    with pytest.raises(NotImplementedError, match="activation scales per group and weight scales per channel"):
        fp8_linear.scaled_gemm_call(5, 384, 256, "group", "channel", torch.bfloat16)


def test_scaled_fp8_definitions_replay_with_their_baselines_on_cpu(tmp_path):
    """The per-tensor and per-token quantizations and both scaled GEMMs pass with their PyTorch
    baselines on CPU at small shapes."""
    calls = [*fp8_linear.scaled_linear_calls(torch.zeros(1, 256, dtype=torch.bfloat16), 384, 256, "tensor", "tensor"),
             *fp8_linear.scaled_linear_calls(torch.zeros(1, 256, dtype=torch.bfloat16), 384, 256, "token", "channel"),
             fp8_linear.scaled_gemm_call(1, 384, 256, "token", "tensor", torch.bfloat16)]
    for definition in (c.definition for c in calls):
        folder = tmp_path / "definitions" / definition.op_type
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{definition.name}.json").write_text(definition.to_json())
        workloads = tmp_path / "workloads" / definition.op_type
        workloads.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"definition": definition.name, "workload": {
            "uuid": f"{definition.name}-{m}", "axes": {"M": m}, "inputs": {n: {"type": "random"} for n in definition.inputs}}})
            for m in (2, 13)]
        (workloads / f"{definition.name}.jsonl").write_text("\n".join(lines) + "\n")
    _, results = run_replay(tmp_path, tmp_path / "out", [], timeout_s=300)
    assert {r.kernel_id for r in results} == {c.definition.name for c in calls}
    assert {r.status.value for r in results} == {"passed"}, [(r.source, r.error) for r in results if r.error]
    assert {r.source.rsplit("__", 1)[-1] for r in results} >= {"torch"}


def test_sglangs_block_scale_fp8_layers_are_recorded_and_other_fp8_paths_listed(monkeypatch):
    """SGLang's ``Fp8LinearMethod.apply`` with 128x128 block-scale weights is the activations'
    per-token-group quantization, then the block-scale GEMM, sized by the layer's logical sizes
    (never by its FP8 weight); with per-channel weight scales on CUDA, the per-token quantization,
    then the per-token / per-channel GEMM (per-token / per-tensor with one weight scale). Marlin,
    MXFP8, the AMX kernel, static activation scales, a bias or an input quantized by the layer
    before are other computations: listed, or a hook error naming them."""
    from types import SimpleNamespace

    from fi_profile.hooks.sglang import fp8_linear as sglang_fp8

    Fp8LinearMethod = type("Fp8LinearMethod", (SimpleNamespace,), {})

    def layer(**method):
        options = {"block_quant": True, "weight_block_size": [128, 128], "use_marlin": False, "use_mxfp8": False,
                   **method}
        # an FP8 weight SGLang may store transposed or packed: its shape must not matter
        return SimpleNamespace(output_size_per_partition=2112, input_size_per_partition=7168, bias=None,
                               weight=torch.zeros(1, dtype=torch.float8_e4m3fn),
                               quant_method=Fp8LinearMethod(**options))

    fp8 = layer()
    assert sglang_fp8.layer_problem(fp8) is None
    x = torch.zeros(5, 7168, dtype=torch.bfloat16)
    calls = sglang_fp8.linear_calls(fp8.quant_method, fp8, x)
    assert [(c.definition.name, c.axes) for c in calls] == [
        ("quant_fp8_per_token_group_k7168_g128", {"M": 5}), ("gemm_fp8_block_scale_n2112_k7168", {"M": 5})]
    assert calls[1].definition.const_axes["num_k_blocks"] == 56
    other = layer(weight_block_size=[64, 128])
    (_, gemm_call) = sglang_fp8.linear_calls(other.quant_method, other, x)
    assert gemm_call.definition.name == "gemm_fp8_block_scale_n2112_k7168_b64x128"
    for options, words in (({"use_marlin": True}, "Marlin"), ({"use_mxfp8": True}, "MXFP8")):
        listed = layer(**options)
        assert words in sglang_fp8.layer_problem(listed)
        with pytest.raises(NotImplementedError, match=words):
            sglang_fp8.linear_calls(listed.quant_method, listed, x)
    # without blocks (``quant_method: fp8``): per-channel weight scales with dynamic activations are
    # SGLang's per-token quantization, then the per-token / per-channel GEMM, on CUDA
    channel = layer(block_quant=False, weight_block_size=None)
    channel.weight_scale = torch.ones(2112, 1)
    assert "no blocks, off CUDA" in sglang_fp8.layer_problem(channel)  # this CPU: listed
    with pytest.raises(NotImplementedError, match="off CUDA"):
        sglang_fp8.linear_calls(channel.quant_method, channel, x)
    monkeypatch.setattr(sglang_fp8, "_on_cuda", lambda tensor: True)
    assert sglang_fp8.layer_problem(channel) is None
    calls = sglang_fp8.linear_calls(channel.quant_method, channel, x)
    assert [(c.definition.name, c.axes) for c in calls] == [
        ("quant_fp8_per_token_k7168", {"M": 5}), ("gemm_fp8_per_token_channel_scale_n2112_k7168", {"M": 5})]
    tensor = layer(block_quant=False, weight_block_size=None)
    tensor.weight_scale = torch.ones(1)  # one weight scale for the tensor: the mixed layout's GEMM
    assert sglang_fp8.layer_problem(tensor) is None
    assert sglang_fp8.linear_calls(tensor.quant_method, tensor, x)[1].definition.name == \
        "gemm_fp8_per_token_tensor_scale_n2112_k7168"
    static = layer(block_quant=False, weight_block_size=None)
    static.weight_scale, static.input_scale = torch.ones(2112), torch.ones(1)
    assert "static activation scales" in sglang_fp8.layer_problem(static)
    with pytest.raises(NotImplementedError, match="the layer before quantized"):
        sglang_fp8.linear_calls(fp8.quant_method, fp8, (x.to(torch.float8_e4m3fn), torch.ones(5, 56)))
    with pytest.raises(NotImplementedError, match="bias"):
        sglang_fp8.linear_calls(fp8.quant_method, fp8, x, bias=torch.zeros(2112))


class QuantMethodForTest:
    """A quantization method a test rule judges (as SGLang's hook judges ``Fp8LinearMethod``)."""


def test_a_quantization_method_with_a_rule_is_judged_by_it_and_others_stay_listed():
    """A layer whose ``quant_method`` has a rule (the methods a hook records) is judged by that rule,
    and marked as one its hook sees; a quantized layer without one stays listed by its method."""
    from fi_profile.capture.layers import LayerRule, uncovered_layers, unseen_layers

    Other = type("AWQLinearMethod", (), {})
    model = torch.nn.Module()
    for name, method in (("a", QuantMethodForTest()), ("b", QuantMethodForTest()), ("c", Other())):
        child = torch.nn.Module()
        child.quant_method = method
        child.broken = name == "b"
        model.add_module(name, child)
    rule = LayerRule(f"{__name__}:QuantMethodForTest", lambda layer: "broken" if layer.broken else None)
    assert uncovered_layers(model, [rule]) == {"broken": 1, "Module with AWQLinearMethod": 1}
    assert uncovered_layers(model, []) == {"Module with QuantMethodForTest": 2, "Module with AWQLinearMethod": 1}
    assert sum(unseen_layers(model, [rule]).values()) == 1  # the judged one without a problem, never called


class KVCacheMethodForTest:
    """An FP8 checkpoint's KV-cache scales method on an attention layer (both engines' ``BaseKVCacheMethod``)."""


class AttentionForTest(torch.nn.Module):
    def __init__(self, kv_cache_dtype: str) -> None:
        super().__init__()
        self.quant_method = KVCacheMethodForTest()
        self.kv_cache_dtype = kv_cache_dtype


def test_an_attention_layer_holding_kv_cache_scales_is_judged_by_its_class_and_its_cache():
    """An FP8 checkpoint gives its attention layers a KV-cache method holding the cache's scales
    (H200, SGLang 0.5.16, Llama-3.1-8B with ``quant_method: fp8``: 32 ``RadixAttention with
    Fp8KVCacheMethod`` were listed while their bf16 attention was recorded). The layer is judged
    by its class's rule, which reads the cache's dtype: a bf16 cache is covered, an FP8 one listed."""
    from fi_profile.capture.layers import LayerRule, by_layer_class, uncovered_layers

    model = torch.nn.Module()
    model.add_module("plain", AttentionForTest("auto"))
    model.add_module("fp8", AttentionForTest("fp8_e4m3"))
    rules = [LayerRule(f"{__name__}:KVCacheMethodForTest", by_layer_class),
             LayerRule(f"{__name__}:AttentionForTest",
                       lambda layer: None if layer.kv_cache_dtype == "auto" else f"KV cache {layer.kv_cache_dtype}")]
    assert uncovered_layers(model, rules) == {"KV cache fp8_e4m3": 1}
    assert uncovered_layers(model, rules[1:]) == {"AttentionForTest with KVCacheMethodForTest": 2}


def test_vllms_block_scale_fp8_layers_are_recorded_through_its_block_scaled_kernels():
    """vLLM's ``Fp8LinearMethod.apply`` hands a block-scale layer to one of its block-scaled kernels
    (vLLM's own classes here): one whose ``apply_weights`` is the base's (quantization, then the
    GEMM: Triton's, DeepGEMM's, CUTLASS's) is recorded as those two calls (the quantization with
    power-of-two scales where vLLM uses DeepGEMM's E8M0); one that takes the bf16 input itself
    (vLLM's CPU kernel, FlashInfer's), Marlin, a bias, per-tensor/per-channel scales are listed by
    what they are."""
    import os
    from types import SimpleNamespace

    if os.environ.get("CI") != "true":
        pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels.linear import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.kernels.linear.scaled_mm.cpu import CPUFp8BlockScaledMMKernel
    from vllm.model_executor.kernels.linear.scaled_mm.triton import TritonFp8BlockScaledMMKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Dynamic128Sym, kFp8Static128BlockSym

    from fi_profile.hooks.vllm import fp8_linear as vllm_fp8

    config = FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8Static128BlockSym, activation_quant_key=kFp8Dynamic128Sym,
                                          input_dtype=torch.bfloat16, out_dtype=torch.bfloat16, weight_shape=(1536, 7168))
    with set_current_vllm_config(VllmConfig()):
        triton, cpu = TritonFp8BlockScaledMMKernel(config), CPUFp8BlockScaledMMKernel(config)
    Fp8LinearMethod = type("Fp8LinearMethod", (SimpleNamespace,), {})

    def layer(kernel, bias=None, **method):
        options = {"block_quant": True, "weight_block_size": [128, 128], "use_marlin": False, "fp8_linear": kernel,
                   **method}
        return SimpleNamespace(output_size_per_partition=1536, input_size_per_partition=7168, bias=bias,
                               weight=torch.empty(0), quant_method=Fp8LinearMethod(**options))

    recorded = layer(triton)
    assert vllm_fp8.layer_problem(recorded) is None
    x = torch.zeros(3, 7168, dtype=torch.bfloat16)
    calls = vllm_fp8.linear_calls(recorded.quant_method, recorded, x)
    assert [(c.definition.name, c.axes) for c in calls] == [
        ("quant_fp8_per_token_group_k7168_g128", {"M": 3}), ("gemm_fp8_block_scale_n1536_k7168", {"M": 3})]
    assert "CPUFp8BlockScaledMMKernel" in vllm_fp8.layer_problem(layer(cpu))
    # DeepGEMM's E8M0 (vLLM's default on Hopper and Blackwell with DeepGEMM): the same GEMM after
    # a quantization whose scales are powers of two, its own Definition
    triton.quant_fp8.use_ue8m0 = True
    assert vllm_fp8.layer_problem(layer(triton)) is None
    assert [c.definition.name for c in vllm_fp8.linear_calls(recorded.quant_method, recorded, x)] == [
        "quant_fp8_per_token_group_ue8m0_k7168_g128", "gemm_fp8_block_scale_n1536_k7168"]
    triton.quant_fp8.use_ue8m0 = False
    for listed, words in ((layer(triton, use_marlin=True), "Marlin"), (layer(triton, bias=torch.zeros(1536)), "bias"),
                          (layer(None, block_quant=False, weight_block_size=None), "not a scaled-mm kernel")):
        assert words in vllm_fp8.layer_problem(listed)
        with pytest.raises(NotImplementedError, match=words):
            vllm_fp8.linear_calls(listed.quant_method, listed, x)


def test_vllms_fp8_layers_without_blocks_are_recorded_through_its_scaled_mm_kernels():
    """Without weight blocks (Llama-3.1-8B-FP8) vLLM's method hands a layer to a scaled-mm kernel
    (vLLM's own class here, as its CUDA build selects CUTLASS's): one whose ``apply_weights`` is the
    base's is recorded as its dynamic activation quantization (per token or per tensor, as its
    configuration's activation key says) then the scaled GEMM (weight scales per tensor or per
    channel, as its weight key says). Static activation scales, or a kernel with its own
    ``apply_weights`` (vLLM's CPU kernel), are listed."""
    import os
    from types import SimpleNamespace

    if os.environ.get("CI") != "true":
        pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels.linear import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.kernels.linear.scaled_mm.cpu import CPUFp8PerTensorScaledMMLinearKernel
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import ChannelWiseTorchFP8ScaledMMLinearKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8DynamicTokenSym,
        kFp8StaticChannelSym,
        kFp8StaticTensorSym,
    )

    from fi_profile.hooks.vllm import fp8_linear as vllm_fp8

    def kernel(weight_key):
        config = FP8ScaledMMLinearLayerConfig(weight_quant_key=weight_key, activation_quant_key=kFp8DynamicTokenSym,
                                              input_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                                              weight_shape=(1024, 4096))
        with set_current_vllm_config(VllmConfig()):
            return ChannelWiseTorchFP8ScaledMMLinearKernel(config, ["weight", "weight_scale", "input_scale", "input_scale_ub"])

    Fp8LinearMethod = type("Fp8LinearMethod", (SimpleNamespace,), {})

    def layer(fp8_kernel):
        return SimpleNamespace(output_size_per_partition=1024, input_size_per_partition=4096, bias=None,
                               weight=torch.empty(0), quant_method=Fp8LinearMethod(
                                   block_quant=False, weight_block_size=None, use_marlin=False, fp8_linear=fp8_kernel))

    x = torch.zeros(5, 4096, dtype=torch.bfloat16)
    for weight_key, expected in ((kFp8StaticTensorSym, ["quant_fp8_per_token_k4096", "gemm_fp8_per_token_tensor_scale_n1024_k4096"]),
                                 (kFp8StaticChannelSym, ["quant_fp8_per_token_k4096",
                                                         "gemm_fp8_per_token_channel_scale_n1024_k4096"])):
        recorded = layer(kernel(weight_key))
        assert vllm_fp8.layer_problem(recorded) is None
        calls = vllm_fp8.linear_calls(recorded.quant_method, recorded, x)
        assert [c.definition.name for c in calls] == expected and all(c.axes == {"M": 5} for c in calls)
    static = kernel(kFp8StaticTensorSym)
    static.quant_fp8.static = True
    assert "static activation scales" in vllm_fp8.layer_problem(layer(static))
    cpu = object.__new__(CPUFp8PerTensorScaledMMLinearKernel)  # its own apply_weights (built only on CPUs it supports)
    assert "own apply_weights" in vllm_fp8.layer_problem(layer(cpu))
    with pytest.raises(NotImplementedError, match="own apply_weights"):
        vllm_fp8.linear_calls(layer(cpu).quant_method, layer(cpu), x)


def test_vllms_compressed_tensors_fp8_scheme_is_recorded_as_its_kernels_run_and_other_schemes_listed():
    """Compressed-tensors checkpoints run each layer through its scheme: the W8A8 FP8 scheme holds
    vLLM's FP8 kernels and is recorded through them as ``Fp8LinearMethod``'s layers are (blocks: the
    per-token-group quantization, then the block GEMM; here with the Triton block kernel, which a
    CPU capture cannot show); W8A16 FP8 (Marlin) or any other scheme is listed by its name."""
    import os
    from types import SimpleNamespace

    if os.environ.get("CI") != "true":
        pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels.linear import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.kernels.linear.scaled_mm.triton import TritonFp8BlockScaledMMKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Dynamic128Sym, kFp8Static128BlockSym

    from fi_profile.hooks.vllm import fp8_linear as vllm_fp8

    config = FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8Static128BlockSym, activation_quant_key=kFp8Dynamic128Sym,
                                          input_dtype=torch.bfloat16, out_dtype=torch.bfloat16, weight_shape=(1536, 7168))
    with set_current_vllm_config(VllmConfig()):
        triton = TritonFp8BlockScaledMMKernel(config)
    method = type("CompressedTensorsLinearMethod", (SimpleNamespace,), {})()

    def layer(scheme):
        return SimpleNamespace(output_size_per_partition=1536, input_size_per_partition=7168, bias=None,
                               weight=torch.empty(0), quant_method=method, scheme=scheme)

    fp8 = layer(type("CompressedTensorsW8A8Fp8", (SimpleNamespace,), {})(weight_block_size=[128, 128], fp8_linear=triton))
    assert vllm_fp8.layer_problem(fp8) is None
    x = torch.zeros(3, 7168, dtype=torch.bfloat16)
    assert [c.definition.name for c in vllm_fp8.linear_calls(method, fp8, x)] == [
        "quant_fp8_per_token_group_k7168_g128", "gemm_fp8_block_scale_n1536_k7168"]
    # the scheme's quantization takes groups of another width than the weight's K blocks: another computation
    triton.quant_fp8.group_size = 64
    assert "activation groups of 64 columns" in vllm_fp8.layer_problem(fp8)
    triton.quant_fp8.group_size = 128
    marlin = layer(type("CompressedTensorsW8A16Fp8", (SimpleNamespace,), {})())
    assert vllm_fp8.layer_problem(marlin) == ("SimpleNamespace with CompressedTensorsLinearMethod, scheme "
                                              "CompressedTensorsW8A16Fp8 (no Definition computes it)")
    with pytest.raises(NotImplementedError, match="CompressedTensorsW8A16Fp8"):
        vllm_fp8.linear_calls(method, marlin, x)


def test_sglangs_compressed_tensors_fp8_scheme_is_recorded_as_its_kernels_run_and_other_schemes_listed(monkeypatch):
    """SGLang's ``CompressedTensorsLinearMethod.apply`` hands each layer to its scheme: the W8A8 FP8
    scheme's block-scale layers are the per-token-group quantization then the block GEMM; without
    blocks on CUDA (an FP8-dynamic checkpoint) ``apply_fp8_linear`` quantizes per token, then the
    GEMM with the layer's per-channel (or one) weight scale; static activation scales and other
    schemes (W8A8 int8 here) are listed by what they are."""
    from types import SimpleNamespace

    from fi_profile.hooks.sglang import fp8_linear as sglang_fp8

    method = type("CompressedTensorsLinearMethod", (SimpleNamespace,), {})()
    Scheme = type("CompressedTensorsW8A8Fp8", (SimpleNamespace,), {})

    def layer(scheme, **attributes):
        return SimpleNamespace(output_size_per_partition=4096, input_size_per_partition=14336, bias=None,
                               weight=torch.zeros(1, dtype=torch.float8_e4m3fn), quant_method=method, scheme=scheme,
                               input_scale=None, **attributes)

    x = torch.zeros(7, 14336, dtype=torch.bfloat16)
    block = layer(Scheme(weight_block_size=[128, 128]))
    assert sglang_fp8.layer_problem(block) is None
    assert [c.definition.name for c in sglang_fp8.linear_calls(method, block, x)] == [
        "quant_fp8_per_token_group_k14336_g128", "gemm_fp8_block_scale_n4096_k14336"]
    channel = layer(Scheme(weight_block_size=None), weight_scale=torch.ones(4096, 1))
    assert "no blocks, off CUDA" in sglang_fp8.layer_problem(channel)
    monkeypatch.setattr(sglang_fp8, "_on_cuda", lambda tensor: True)
    assert sglang_fp8.layer_problem(channel) is None
    assert [(c.definition.name, c.axes) for c in sglang_fp8.linear_calls(method, channel, x)] == [
        ("quant_fp8_per_token_k14336", {"M": 7}), ("gemm_fp8_per_token_channel_scale_n4096_k14336", {"M": 7})]
    static = layer(Scheme(weight_block_size=None), weight_scale=torch.ones(1))
    static.input_scale = torch.ones(1)
    assert "CompressedTensorsLinearMethod, scheme CompressedTensorsW8A8Fp8: static activation scales" in \
        sglang_fp8.layer_problem(static)
    int8 = layer(type("CompressedTensorsW8A8Int8", (SimpleNamespace,), {})())
    assert sglang_fp8.layer_problem(int8) == ("SimpleNamespace with CompressedTensorsLinearMethod, scheme "
                                              "CompressedTensorsW8A8Int8 (no Definition computes it)")
    with pytest.raises(NotImplementedError, match="CompressedTensorsW8A8Int8"):
        sglang_fp8.linear_calls(method, int8, x)
