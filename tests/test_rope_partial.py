"""Partial rotary (``rotary_dim < head_dim``: Qwen3-Next's 64 of 256, GLM's, Phi's): the Definition
(``..._d{D}_rd{R}_...``, flashinfer-trace's naming) rotates the first dimensions NeoX style within
them and passes the rest through, as vLLM's ``RotaryEmbedding`` does; the PyTorch baseline agrees;
classes whose Definitions rotate the whole head still list a partial layer."""

from __future__ import annotations

import pytest
import torch

from fi_profile.entry_points import run_reference
from fi_profile.families.rope import layer_calls, layer_problem

base = pytest.importorskip("vllm.model_executor.layers.rotary_embedding.base")


@pytest.fixture(scope="module")
def vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


@pytest.mark.parametrize("head, rotary, theta, name", [
    (256, 64, 10000000.0, "rope_neox_style_h16_kv2_d256_rd64_theta10000000"),  # Qwen3-Next's: the template
    (128, 64, 10000.0, "rope_neox_style_h16_kv2_d128_rd64_theta10000"),
    (64, 64, 10000.0, "rope_neox_style_h16_kv2_d64_theta10000"),  # the whole head: the plain name
])
def test_partial_rotary_computes_what_vllms_layer_computes(vllm_config, head, rotary, theta, name):
    layer = base.RotaryEmbedding(head, rotary, 4096, theta, True, torch.bfloat16)
    assert layer_problem(layer) is None
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(23, 16, head, generator=generator).to(torch.bfloat16)
    k = torch.randn(23, 2, head, generator=generator).to(torch.bfloat16)
    positions = torch.randint(0, 4096, (23,), generator=generator)
    (call,) = layer_calls(layer, q.reshape(23, -1), k.reshape(23, -1))
    assert call.definition.name == name
    want_q, want_k = layer.forward_native(positions, q.clone().reshape(23, -1), k.clone().reshape(23, -1))
    ours = run_reference(call.definition, {"q": q, "k": k, "positions": positions})
    for got, want in ((ours["q_out"], want_q), (ours["k_out"], want_k)):
        assert torch.allclose(got.float().reshape(23, -1), want.float(), atol=0.04, rtol=0.02)
    assert torch.equal(ours["q_out"][..., rotary:], q[..., rotary:])  # passed through
    from fi_profile.replay.baseline_solutions import fitted_baseline

    _, baseline, source = fitted_baseline(call.definition)
    assert baseline.file == "torch_rope.py"
    namespace: dict = {}
    exec(compile(source, baseline.file, "exec"), namespace)
    got_q, got_k = namespace["run"](q, k, positions)
    assert torch.allclose(got_q.float(), ours["q_out"].float(), atol=0.04)
    assert torch.allclose(got_k.float(), ours["k_out"].float(), atol=0.04)


def test_a_partial_rope_of_a_class_that_rotates_the_whole_head_is_listed(vllm_config):
    from vllm.model_executor.layers.rotary_embedding.linear_scaling_rope import LinearScalingRotaryEmbedding

    layer = LinearScalingRotaryEmbedding(128, 64, 4096, 10000.0, True, 8.0, torch.bfloat16)
    problem = layer_problem(layer)
    assert problem is not None and "rotary_dim=64" in problem
    odd = base.RotaryEmbedding(128, 64, 4096, 10000.0, False, torch.bfloat16)  # interleaved pairs
    assert "is_neox_style=False" in (layer_problem(odd) or "")
