"""DeepSeek's YaRN RoPE (profiler/families/rope): the Definition made from a layer's own constants
computes what vLLM's ``DeepseekScalingRotaryEmbedding`` computes, for DeepSeek-V3's constants and
for others (another factor, theta, magnitude); the PyTorch baseline agrees with the reference; and
a layer this Definition does not compute is reported, not mapped to it."""

from __future__ import annotations

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families.rope import _yarn_params, call, layer_problem

vllm_rope = pytest.importorskip("vllm.model_executor.layers.rotary_embedding.deepseek_scaling_rope")


@pytest.fixture(scope="module")
def vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):  # vLLM's layers are built under a config
        yield


def _layer(factor=40.0, theta=10000.0, mscale=1.0, mscale_all_dim=1.0, neox=False, rotary_dim=64):
    return vllm_rope.DeepseekScalingRotaryEmbedding(64, rotary_dim, 4096, theta, neox, factor, torch.bfloat16,
                                                    beta_fast=32, beta_slow=1, mscale=mscale,
                                                    mscale_all_dim=mscale_all_dim)


@pytest.mark.parametrize("constants, name", [
    ({}, "rope_deepseek_yarn_h16_kv1_d64"),
    ({"factor": 4.0}, "rope_deepseek_yarn_h16_kv1_d64_f4"),
    ({"factor": 32.0, "theta": 50000.0}, "rope_deepseek_yarn_h16_kv1_d64_theta50000_f32"),
    ({"mscale_all_dim": 0.707}, None),  # cos and sin scaled: a digest of the constants in the name
])
def test_the_definition_computes_what_vllms_layer_computes(vllm_config, constants, name):
    layer = _layer(**constants)
    assert layer_problem(layer) is None
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(37, 16, 64, generator=generator).to(torch.bfloat16)
    k = torch.randn(37, 1, 64, generator=generator).to(torch.bfloat16)
    positions = torch.randint(0, int(4096 * layer.scaling_factor), (37,), generator=generator)
    definition = call(q, 16, 1, 64, _yarn_params(layer)).definition
    if name is not None:
        assert definition.name == name
    else:
        assert definition.name.startswith("rope_deepseek_yarn_h16_kv1_d64_y") and layer.mscale != 1.0
    expected_q, expected_k = layer.forward_native(positions, q.clone(), k.clone())
    ours = run_reference(definition, {"q": q, "k": k, "positions": positions})
    # vLLM rotates in bf16 with a bf16 cos/sin cache; the reference in float32: one bf16 step apart at most
    for got, want in ((ours["q_out"], expected_q), (ours["k_out"], expected_k)):
        assert torch.allclose(got.float(), want.float(), atol=0.04, rtol=0.02), (got.float() - want.float()).abs().max()
    # and far from the NeoX pairing, or from no scaling: the comparison tells them apart
    assert (ours["q_out"].float() - q.float()).abs().max() > 0.5


def test_the_pytorch_baseline_fitted_to_it_agrees_with_the_reference(vllm_config):
    from fi_profile.replay.baseline_solutions import fitted_baseline

    layer = _layer(factor=4.0, mscale_all_dim=0.5)
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(9, 4, 64, generator=generator).to(torch.bfloat16)
    k = torch.randn(9, 1, 64, generator=generator).to(torch.bfloat16)
    positions = torch.arange(9) * 1000
    definition = call(q, 4, 1, 64, _yarn_params(layer)).definition
    _, baseline, source = fitted_baseline(definition)
    assert baseline.file == "torch_yarn_rope.py"  # not the NeoX one: it needs constants this Definition lacks
    assert "FACTOR = 4.0" in source and f"MSCALE = {layer.mscale!r}" in source
    namespace: dict = {}
    exec(compile(source, "torch_yarn_rope.py", "exec"), namespace)
    got_q, got_k = namespace["run"](q, k, positions)
    ours = run_reference(definition, {"q": q, "k": k, "positions": positions})
    assert torch.allclose(got_q.float(), ours["q_out"].float(), atol=0.02)
    assert torch.allclose(got_k.float(), ours["k_out"].float(), atol=0.02)


@pytest.mark.parametrize("changes, says", [
    ({"neox": True}, "is_neox_style=True"),
    ({"rotary_dim": 32}, "rotary_dim=32"),
])
def test_a_deepseek_rope_no_definition_computes_is_reported(vllm_config, changes, says):
    problem = layer_problem(_layer(**changes))
    assert problem is not None and says in problem and "DeepseekScalingRotaryEmbedding" in problem


def test_sglangs_layer_with_its_extrapolation_and_attention_factors_computes_what_the_definition_does():
    """SGLang's class (its own venv, a subprocess) folds an attention factor into its magnitude and
    scales its extrapolation mask: each setting a Definition of its own, each matching the layer."""
    import json
    import os
    import subprocess
    from pathlib import Path

    python = Path(os.environ.get("FI_PROFILE_SGLANG_PYTHON", Path(__file__).parents[1] / ".venv-sglang/bin/python"))
    if not python.is_file():
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"{python} missing: .ci/setup should have made it")
        pytest.skip(f"no SGLang venv at {python}")
    proc = subprocess.run([str(python), str(Path(__file__).with_name("sglang_rope_script.py"))], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    found = json.loads(lines[-1][len("RESULT "):])
    assert len({f["name"] for f in found}) == 2  # the factors change the computation: two Definitions
    for f in found:
        assert f["problem"] is None and f["name"].startswith("rope_deepseek_yarn_h8_kv1_d64_f4_y")
        assert f["q"] <= 0.04 and f["k"] <= 0.04, f


# the generic YaRN (Qwen's, gpt-oss's rope_type "yarn"): NeoX style, its ramp truncated or not

def _generic(factor=32.0, theta=150000.0, truncate=False, beta_fast=32, attention_factor=None):
    from vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope import YaRNScalingRotaryEmbedding

    return YaRNScalingRotaryEmbedding(64, 64, 4096, theta, True, factor, torch.bfloat16, beta_fast=beta_fast,
                                      beta_slow=1, truncate=truncate, attention_factor=attention_factor)


@pytest.mark.parametrize("constants, name", [
    ({}, "rope_yarn_neox_style_h8_kv2_d64_theta150000_f32_ctx4096_untruncated"),  # gpt-oss's
    ({"factor": 4.0, "theta": 1000000.0, "truncate": True}, "rope_yarn_neox_style_h8_kv2_d64_theta1000000_f4_ctx4096"),
    ({"beta_fast": 16, "attention_factor": 1.25}, "rope_yarn_neox_style_h8_kv2_d64_theta150000_f32_ctx4096_b16_1_m1p25"
                                                  "_untruncated"),
])
def test_the_generic_yarn_definition_computes_what_vllms_layer_computes(vllm_config, constants, name):
    from fi_profile.families.rope import _generic_yarn_params

    layer = _generic(**constants)
    assert layer_problem(layer) is None
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(41, 8, 64, generator=generator).to(torch.bfloat16)
    k = torch.randn(41, 2, 64, generator=generator).to(torch.bfloat16)
    positions = torch.randint(0, int(4096 * layer.scaling_factor), (41,), generator=generator)
    definition = call(q, 8, 2, 64, _generic_yarn_params(layer)).definition
    assert definition.name == name
    expected_q, expected_k = layer.forward_native(positions, q.clone(), k.clone())
    ours = run_reference(definition, {"q": q, "k": k, "positions": positions})
    for got, want in ((ours["q_out"], expected_q), (ours["k_out"], expected_k)):
        assert torch.allclose(got.float(), want.float(), atol=0.04, rtol=0.02), (got.float() - want.float()).abs().max()
    from fi_profile.replay.baseline_solutions import fitted_baseline

    _, baseline, source = fitted_baseline(definition)
    assert baseline.file == "torch_yarn_rope.py" and "NEOX_STYLE = True" in source
    namespace: dict = {}
    exec(compile(source, "torch_yarn_rope.py", "exec"), namespace)
    got_q, got_k = namespace["run"](q, k, positions)
    assert torch.allclose(got_q.float(), ours["q_out"].float(), atol=0.04)
    assert torch.allclose(got_k.float(), ours["k_out"].float(), atol=0.04)


def test_truncating_the_ramp_or_not_is_another_computation_and_the_reference_tells_them_apart(vllm_config):
    from fi_profile.families.rope import _generic_yarn_params

    q = torch.randn(16, 8, 64).to(torch.bfloat16)
    k = torch.randn(16, 2, 64).to(torch.bfloat16)
    positions = torch.arange(16) * 8000
    untruncated, truncated = (call(q, 8, 2, 64, _generic_yarn_params(_generic(truncate=t))).definition
                              for t in (False, True))
    assert untruncated.name != truncated.name and truncated.name.endswith("_ctx4096")
    a, b = (run_reference(d, {"q": q, "k": k, "positions": positions})["q_out"].float() for d in (untruncated, truncated))
    assert (a - b).abs().max() > 0.1


def test_a_generic_yarn_layer_whose_cache_is_not_its_constants_is_listed_with_the_difference(vllm_config, monkeypatch):
    """A layer whose class builds its cos/sin cache from something its constants do not say (here
    an extra magnitude folded in, as an attribute a later vLLM adds would) is listed, not recorded
    under the constants it shows; so is one whose class builds no cache fi-profile can check."""
    from vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope import YaRNScalingRotaryEmbedding

    original = YaRNScalingRotaryEmbedding._compute_cos_sin_cache
    monkeypatch.setattr(YaRNScalingRotaryEmbedding, "_compute_cos_sin_cache", lambda self: original(self) * 0.9)
    problem = layer_problem(_generic())
    assert problem is not None and "cos/sin cache is not its constants'" in problem, problem
    monkeypatch.setattr(YaRNScalingRotaryEmbedding, "_compute_cos_sin_cache", original)
    layer = _generic()
    assert layer_problem(layer) is None
    other = _generic()
    other.truncate = True  # read by name: another Definition, and the cache its class builds agrees
    assert layer_problem(other) is None
