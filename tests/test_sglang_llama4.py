"""Llama-4 in SGLang: its MoE router (``TopK`` holding ``Llama4MoE.custom_routing_function``, the
experts after it taking the weight on their input) is recorded as the ``moe_*_llama4_routing_*``
Definition that vLLM's is; any other custom routing function is listed by name. Its chunked layers
(``use_irope``) run as causal attention over every key on SGLang's ``triton`` and ``torch_native``
backends, and are recorded so; the dense model runs in SGLang on CPU (its CPU MoE refuses the weight
on the input, so a Llama-4 MoE runs on GPUs only)."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from test_capture_sglang import SGLANG_PYTHON
from test_capture_vllm import MODELS, capture, counts

from fi_profile.families import moe
from fi_profile.hooks.sglang import moe as sglang_moe

sglang_only = pytest.mark.skipif(not SGLANG_PYTHON.is_file() and not os.environ.get("CI"),
                                 reason=f"no SGLang venv at {SGLANG_PYTHON}")


def _sglangs_routing_function():
    """A function named as SGLang's Llama-4 routing is (the SGLang venv's test checks the real one's name)."""
    module, qualname = sglang_moe.LLAMA4_ROUTING.split(":")

    def routing(hidden_states, gating_output, topk, renormalize):
        weights, ids = gating_output.topk(topk, dim=-1)
        return weights.float().sigmoid().to(hidden_states.dtype), ids.to(torch.int32)

    routing.__module__, routing.__qualname__ = module, qualname
    return routing


def _experts(weight_on_input: bool = True, **config):
    runner = SimpleNamespace(activation="silu", is_gated=True, apply_router_weight_on_input=weight_on_input,
                             num_experts=4, num_local_experts=4, hidden_size=64, intermediate_size_per_partition=32,
                             top_k=1, num_fused_shared_experts=0, routed_scaling_factor=None, **config)
    return type("FusedMoE", (SimpleNamespace,), {})(
        moe_runner_config=runner, quant_method=type("UnquantizedFusedMoEMethod", (), {})(), num_experts=4,
        num_local_experts=4, intermediate_size_per_partition=32, w13_weight_bias=None, w2_weight_bias=None)


def _route(function, renormalize=False):
    router = type("TopK", (SimpleNamespace,), {})(topk_config=SimpleNamespace(
        top_k=1, renormalize=renormalize, custom_routing_function=function, use_grouped_topk=False,
        correction_bias=None, scoring_func="softmax", routed_scaling_factor=None))
    sglang_moe.routing_calls(router, torch.zeros(3, 4, dtype=torch.bfloat16))
    return router


def test_sglangs_llama4_moe_is_recorded_as_its_routing_and_any_other_custom_function_is_listed_by_name():
    routing = _sglangs_routing_function()
    assert sglang_moe.routing_problem(_route(routing)) is None  # the router alone: judged with its experts
    (call,) = sglang_moe.layer_calls(_experts(), torch.zeros(3, 64, dtype=torch.bfloat16))
    assert call.definition.name == "moe_bf16_llama4_routing_topk1_e4_h64_i32" and call.axes == {"seq_len": 3}
    assert "WEIGHT_ON_INPUT = True" in call.definition.reference

    # the same function with the weight on the output is another computation: listed, never recorded
    _route(routing)
    with pytest.raises(NotImplementedError, match=f"custom routing {sglang_moe.LLAMA4_ROUTING}"):
        sglang_moe.layer_calls(_experts(weight_on_input=False), torch.zeros(3, 64, dtype=torch.bfloat16))
    _route(routing, renormalize=True)
    with pytest.raises(NotImplementedError, match="custom routing"):
        sglang_moe.layer_calls(_experts(), torch.zeros(3, 64, dtype=torch.bfloat16))

    def token_choice(hidden_states, gating_output, topk, renormalize):
        return gating_output.sigmoid().topk(topk)

    problem = sglang_moe.routing_problem(_route(token_choice))
    assert problem is not None and f"custom routing {__name__}:" in problem and "token_choice" in problem
    sglang_moe.STEP.context.pop("moe_routing", None)


@sglang_only
def test_the_real_sglang_routing_function_is_known_by_name_and_routes_as_the_definition_says():
    """In the SGLang the tests run (its venv): ``Llama4MoE.custom_routing_function`` in a real
    ``TopKConfig`` is Llama-4's routing to the hook, and it routes as the Definition's reference
    does: the top-1 logit of each token, through a sigmoid."""
    probe = "\n".join([
        "import torch",
        "from sglang.srt.layers.moe.topk import TopKConfig",
        "from sglang.srt.models.llama4 import Llama4MoE",
        "from fi_profile.hooks.sglang import moe as hook",
        "config = TopKConfig(top_k=1, renormalize=False, custom_routing_function=Llama4MoE.custom_routing_function)",
        "assert hook.llama4_routing(config) and hook._routing_found(config) == [], hook._routing_found(config)",
        "g = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16) * 4",
        "with torch.compiler.set_stance('force_eager'):",
        "    w, ids = Llama4MoE.custom_routing_function(hidden_states=torch.zeros(64, 8, dtype=torch.bfloat16),",
        "                                               gating_output=g, topk=1, renormalize=False)",
        "assert torch.equal(ids.long().squeeze(1), g.float().argmax(-1)), 'not the top-1 expert'",
        "assert torch.equal(w, g.float().max(-1, keepdim=True).values.sigmoid().to(torch.bfloat16)), 'not its sigmoid'",
        "print('OK')",
    ])
    found = subprocess.run([str(SGLANG_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300)
    assert found.returncode == 0 and found.stdout.strip().endswith("OK"), found.stderr[-3000:]


@sglang_only
def test_sglang_records_dense_llama4_whole_its_chunked_layers_as_the_causal_attention_it_runs(tmp_path):
    """Llama-4 text with its MoE layers made dense (``interleave_moe_layer_step`` past the layers):
    three chunked layers with RoPE and weightless q/k norms, one NoPE layer. SGLang's CPU backend
    (``torch_native``) reads no ``attention_chunk_size``: all four layers attend over every key (the
    prompts of 140 tokens cross the chunks of 128), and the record says so with plain attention,
    nothing listed. They were listed before (``use_irope=True``)."""
    result = capture(tmp_path, "sglang-llama4-dense", python=SGLANG_PYTHON, framework="sglang",
                     model=str(MODELS / "tiny-llama4-dense"),
                     scenario={"num_prompts": 3, "input_len": 140, "output_len": 6})
    run = result["record"]["run"]
    assert run["not_covered"] == {} and not run["hook_errors"] and "incomplete" not in run, run
    found = counts(result)
    steps = found["greedy_sampling_from_logits_v2048"]
    layers, chunked = 4, 3
    attention = Counter({k: v for k, v in found.items() if k.startswith(("gqa_", "kv_cache_write"))})
    assert attention == {"kv_cache_write_kv2_d64_ps1": layers * steps,
                         "gqa_paged_decode_h4_kv2_d64_ps1": layers * (steps - 1),
                         "gqa_paged_prefill_causal_h4_kv2_d64_ps1": layers}, attention
    assert found["rmsnorm_noweight_h64"] == chunked * steps  # queries and keys in one call per layer
    (rope,) = [name for name in found if name.startswith("rope_")]
    assert found[rope] == chunked * steps  # the NoPE layer has none
    assert found["silu_and_mul_i512"] == layers * steps and not any(name.startswith(moe.KEY) for name in found)
