"""Layer calls inside CUDA graphs that an engine captures itself (SGLang's way): the calls made
while the stream captures are the graph's, warm-up runs are not, and each replay adds them at the
graph's (padded) size. On a real CUDA graph where CUDA is; on CPU the stream's capture state is
simulated (the captured run is the one marked capturing). The real engine ran on GPUs: BENCHMARKS.md."""

import contextlib
from dataclasses import dataclass

import pytest
import torch

from fi_profile.capture import graph_capture
from fi_profile.capture.graph_runs import graph_calls
from fi_profile.capture.kernel_accounting import ACCOUNTING
from fi_profile.capture.patching import span_only, wrap, wrap_around, wrap_boundary
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import gemm
from fi_profile.hooks.sglang import steps

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SIMULATED = {"capturing": False}  # without CUDA: the stream's capture state, as the backend sets it


@pytest.fixture(autouse=True)
def stream_capture_state(monkeypatch):
    if not CUDA:
        monkeypatch.setattr(graph_capture, "stream_capturing", lambda: SIMULATED["capturing"])


@dataclass(frozen=True)
class ShapeKey:
    size: int


def make_backend(name: str) -> type:
    """A graph backend like SGLang's (two warm-up runs, then the captured one), named like one of
    them so that the adapter's capture and replay hooks apply, and hooked as the adapter hooks them."""

    class Backend:
        def __init__(self) -> None:
            self.graphs: dict = {}

        def capture_one(self, shape_key: ShapeKey, forward_fn) -> None:
            for _ in range(2):
                forward_fn()
            graph = torch.cuda.CUDAGraph() if CUDA else None
            if CUDA:
                with torch.cuda.graph(graph):
                    out = forward_fn()
            else:
                SIMULATED["capturing"] = True
                try:
                    out = forward_fn()
                finally:
                    SIMULATED["capturing"] = False
            self.graphs[shape_key] = (graph, out)

        def replay(self, shape_key: ShapeKey) -> torch.Tensor:
            graph, out = self.graphs[shape_key]
            if graph is not None:
                graph.replay()
            return out

    Backend.__name__ = name
    Backend.capture_one = wrap_around(Backend.capture_one, "graph_capture", steps.graph_capture, Backend)
    Backend.replay = wrap_boundary(Backend.replay, "graph_replay", steps.graph_replay, Backend)
    return Backend


def test_captured_calls_are_counted_at_each_replay_with_the_padded_size(tmp_path, monkeypatch):
    linear = wrap(lambda x: x * 2, "gemm", lambda x: [gemm.call(x, 64, 32)])
    boundary = wrap_boundary(lambda sig: None, "step", lambda sig: RECORDER.begin_step(sig, tokens=sig[1]))
    buffer = torch.zeros(8, 32, dtype=torch.bfloat16, device=DEVICE)
    backend = make_backend("FullCudaGraphBackend")()
    RECORDER.reset()
    for size in (8, 4):  # at engine start, before recording: as SGLang captures
        backend.capture_one(ShapeKey(size), lambda size=size: [linear(buffer[:size]) for _ in range(3)])
    monkeypatch.setattr(RECORDER, "active", True)
    for real in (3, 3, 4, 7):  # scheduled requests; graphs of 4 and 8 run them
        boundary(("decode", real))
        backend.replay(ShapeKey(4 if real <= 4 else 8))
        linear(torch.zeros(real, 32, dtype=torch.bfloat16, device=DEVICE))  # after the graph, eager
    RECORDER.flush(tmp_path)
    assert not RECORDER.errors
    assert RECORDER.step_stats == {"learned": 3, "replayed": 1}
    assert RECORDER.workloads == {  # 3 layers a replay at the graph's size; the eager piece at the real one
        ("gemm_bf16_n64_k32", (("M", 4),)): 3 * 3 + 1, ("gemm_bf16_n64_k32", (("M", 8),)): 3,
        ("gemm_bf16_n64_k32", (("M", 3),)): 2, ("gemm_bf16_n64_k32", (("M", 7),)): 1,
    }
    assert RECORDER.graph_runs == {"full_cuda_graph": 4}
    assert RECORDER.padding == {(4, 3): 2, (4, 4): 1, (8, 7): 1}
    assert RECORDER.execution == {"gemm_bf16_n64_k32": {"cuda_graph", "eager"}}
    RECORDER.active = False


def test_a_graph_captured_without_hooked_calls_is_a_hook_error(tmp_path, monkeypatch):
    """A graph whose forward was compiled (or captured before the hooks were in) ran no hooked call
    while captured: its replays are errors, never silently empty steps."""
    backend = make_backend("BreakableCudaGraphBackend")()
    RECORDER.reset()
    backend.capture_one(ShapeKey(2), lambda: torch.ones(2, device=DEVICE) * 2)
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.begin_step(("decode", 2), tokens=2)
    backend.replay(ShapeKey(2))
    RECORDER.flush(tmp_path)
    assert any("no hooked layer call was captured" in e for e in RECORDER.errors)
    RECORDER.active = False


def test_a_graph_captured_while_recording_adds_nothing_to_the_step(tmp_path, monkeypatch):
    """SGLang recaptures its graphs mid-run when a batch needs another hidden-state mode: the
    warm-up and captured runs are not the step's calls; the replay that follows is."""
    linear = wrap(lambda x: x * 2, "gemm", lambda x: [gemm.call(x, 64, 32)])
    buffer = torch.zeros(2, 32, dtype=torch.bfloat16, device=DEVICE)
    backend = make_backend("FullCudaGraphBackend")()
    RECORDER.reset()
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.begin_step(("decode", 2), tokens=2)
    backend.capture_one(ShapeKey(2), lambda: [linear(buffer) for _ in range(4)])
    assert not RECORDER.calls and RECORDER._learning.empty
    backend.replay(ShapeKey(2))
    RECORDER.flush(tmp_path)
    assert RECORDER.calls == {"gemm_bf16_n64_k32": 4} and not RECORDER.errors
    RECORDER.active = False


def test_a_graph_runner_whose_backend_captured_no_calls_is_a_hook_error(monkeypatch):
    """SGLang's CPU graph runner and its torch.compile backends run no hooked layer at capture:
    their steps are said (hook errors), never silently empty; the capturing backends pass."""
    RECORDER.reset()
    monkeypatch.setattr(RECORDER, "active", True)

    class CPUGraphRunner:
        def execute(self, forward_batch):
            return forward_batch

    class DecodeCudaGraphRunner(CPUGraphRunner):
        backend = make_backend("FullCudaGraphBackend")()

    for runner in (CPUGraphRunner, DecodeCudaGraphRunner):
        runner.execute = wrap_boundary(runner.execute, "graph_step", steps.graph_runner_runs, runner)
    assert DecodeCudaGraphRunner().execute(7) == 7 and not RECORDER.errors
    assert CPUGraphRunner().execute(7) == 7  # the engine's step still runs
    (error,) = RECORDER.errors
    assert "SGLang's CPUGraphRunner (NoneType), whose layer calls fi-profile does not record" in error
    RECORDER.active = False


def test_layers_of_one_shape_are_realized_once_a_learned_step_and_counted_per_layer(tmp_path, monkeypatch):
    """A learned step of an 8B model's graph realizes ~290 templates; layers that make the same
    calls are one group (realized once, counted once per layer), a hook that failed while the
    graph was captured is lost once per layer, and a replayed step counts the same."""
    from fi_profile.capture.traced import Template

    realized = []
    realize = Template.realize
    monkeypatch.setattr(Template, "realize", lambda self, sizes: realized.append(self.op) or realize(self, sizes))
    qkv = wrap(lambda x: x, "gemm", lambda x: [gemm.call(x, 96, 32)])
    down = wrap(lambda x: x, "gemm", lambda x: [gemm.call(x, 32, 64)])
    broken = wrap(lambda x: x, "rmsnorm", lambda x: [1 / 0])
    buffer = torch.zeros(4, 32, dtype=torch.bfloat16, device=DEVICE)
    backend = make_backend("FullCudaGraphBackend")()
    RECORDER.reset()
    backend.capture_one(ShapeKey(4), lambda: [f(buffer) for _ in range(5) for f in (broken, qkv, down)])
    trace = graph_capture.CAPTURED[(backend, ShapeKey(4))]
    assert [(op, layers) for op, _, layers in trace.groups()] == [("rmsnorm", 5), ("gemm", 5), ("gemm", 5)]
    monkeypatch.setattr(RECORDER, "active", True)
    for _ in range(2):  # learned, then replayed
        RECORDER.begin_step(("decode", 4), tokens=4)
        backend.replay(ShapeKey(4))
    RECORDER.flush(tmp_path)
    assert realized == ["gemm", "gemm"]  # once per group, in the learned step only (the failed one is lost)
    assert RECORDER.step_stats == {"learned": 1, "replayed": 1}
    assert RECORDER.calls == {"gemm_bf16_n96_k32": 10, "gemm_bf16_n32_k64": 10}
    assert RECORDER.lost_calls == {"rmsnorm": 10}
    assert list(RECORDER.errors.values()) == [5]  # the learned step's failures; a replay counts them as lost
    assert not any("step replay" in e for e in RECORDER.errors)
    RECORDER.active = False


def test_a_prologue_captured_in_a_graph_is_a_template_of_its_nodes_that_records_nothing(tmp_path, monkeypatch):
    """A prologue (Gemma-3's RoPE tables, computed once per forward for every layer's rotation)
    while SGLang captures a graph: a template whose nodes are its kernels, naming the Definitions
    it prepares, for the accounting; the step's calls are the other hooks' alone."""
    from fi_profile.capture.patching import wrap_prologue

    nodes = iter(range(100))
    monkeypatch.setattr(graph_capture, "captured_nodes", lambda: next(nodes) if SIMULATED["capturing"] else None)
    linear = wrap(lambda x: x * 2, "gemm", lambda x: [gemm.call(x, 64, 32)])
    table = wrap_prologue(lambda x: x + 1, "gemm", lambda x: [gemm.call(x, 64, 32)])
    buffer = torch.zeros(2, 32, dtype=torch.bfloat16, device=DEVICE)
    backend = make_backend("FullCudaGraphBackend")()
    RECORDER.reset()
    backend.capture_one(ShapeKey(2), lambda: [table(buffer), linear(buffer), linear(buffer)])
    trace = graph_capture.CAPTURED[(backend, ShapeKey(2))]
    first = trace.templates[0]
    assert first.prologue == (gemm.call(buffer, 64, 32).definition.name,) and not first.calls
    assert first.nodes is not None and first.nodes[1] > first.nodes[0]
    assert [t.prologue for t in trace.templates[1:]] == [(), ()]
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.begin_step(("decode", 2), tokens=2)
    backend.replay(ShapeKey(2))
    RECORDER.flush(tmp_path)
    assert RECORDER.calls == {"gemm_bf16_n64_k32": 2} and not RECORDER.errors
    RECORDER.active = False


def test_a_call_that_feeds_another_goes_after_the_hooked_calls_inside_it(monkeypatch):
    """SGLang's block fusing its shared expert: the gate's GEMM (a hooked call of its own) runs
    inside the hook that feeds the MoE call after it (the sigmoid and the append, the MoE's): the
    feeding template goes after the GEMM's, its nodes those after the GEMM's, so that the order of
    the graph's calls is the order of their kernels."""
    launched = [0]  # the graph's nodes so far: each function below launches one kernel

    def kernel(x):
        launched[0] += 1
        return x

    monkeypatch.setattr(graph_capture, "captured_nodes", lambda: launched[0] if SIMULATED["capturing"] else None)
    linear = wrap(kernel, "gemm", lambda x: [gemm.call(x, 64, 32)])
    experts = wrap(kernel, "moe", lambda x: [gemm.call(x, 16, 32)])
    feeder = wrap(lambda x: kernel(linear(x)), "moe_shared_gate", lambda x: [], feeds="moe")
    buffer = torch.zeros(2, 32, dtype=torch.bfloat16, device=DEVICE)
    backend = make_backend("FullCudaGraphBackend")()
    RECORDER.reset()
    backend.capture_one(ShapeKey(2), lambda: [feeder(buffer), experts(buffer)])
    trace = graph_capture.CAPTURED[(backend, ShapeKey(2))]
    assert [t.op for t in trace.templates] == ["gemm", "moe_shared_gate", "moe"]
    gate, fed, _ = trace.templates
    first = gate.nodes[0]  # after the warm-up runs' kernels
    assert gate.nodes == (first, first + 1) and fed.feeds == "moe" and fed.nodes == (first + 1, first + 2)
    # a feeding call with kernels of its own before the hooked call inside it: its nodes are not one run
    feeder = wrap(lambda x: linear(kernel(x)), "moe_shared_gate", lambda x: [], feeds="moe")
    backend.capture_one(ShapeKey(4), lambda: [feeder(buffer), experts(buffer)])
    gate, fed, _ = graph_capture.CAPTURED[(backend, ShapeKey(4))].templates
    assert gate.op == "gemm" and fed.op == "moe_shared_gate" and fed.nodes is None


def test_a_layer_whose_own_kernels_are_its_core_calls_spans_the_calls_it_makes(monkeypatch):
    """SGLang's Gated DeltaNet layer (its hook point a span of op ``gdn``): its recurrence is hooked
    on an inner module, and its own kernels (its projections' split for the conv1d) run between its
    hooked calls. Captured in a graph, the core call's template spans the calls the layer made (two
    before it, two after), as a traced method's does: the accounting gives the layer's kernels named
    after no family between them to it. Eagerly, while kernels are accounted for, the layer runs in
    a range whose kernels are its next ``gdn`` call's; not while nothing is accounted for."""
    projection = wrap(lambda x: x, "gemm", lambda x: [gemm.call(x, 64, 32)])
    core = wrap(lambda x: x, "gdn", lambda x: [gemm.call(x, 16, 32)])
    norm = wrap(lambda x: x, "rmsnorm", lambda x: [gemm.call(x, 8, 32)])
    layer = wrap_around(lambda x: projection(norm(core(projection(projection(x))))), "gdn_layer",
                        lambda: contextlib.nullcontext(), span="gdn")
    buffer = torch.zeros(2, 32, dtype=torch.bfloat16, device=DEVICE)
    backend = make_backend("FullCudaGraphBackend")()
    RECORDER.reset()
    backend.capture_one(ShapeKey(2), lambda: layer(buffer))
    trace = graph_capture.CAPTURED[(backend, ShapeKey(2))]
    assert [t.op for t in trace.templates] == ["gemm", "gemm", "gdn", "rmsnorm", "gemm"]
    assert [t.span for t in trace.templates] == [None, None, (2, 2), None, None]
    assert ACCOUNTING.graphs[graph_calls(trace, ())].spans == {2: (0, 5)}
    # a span without its core call inside (an idle step) marks nothing
    backend.capture_one(ShapeKey(4), lambda: wrap_around(lambda x: projection(x), "gdn_layer",
                                                         lambda: contextlib.nullcontext(), span="gdn")(buffer))
    assert [t.span for t in graph_capture.CAPTURED[(backend, ShapeKey(4))].templates] == [None]
    # SGLang's logits processor: its lm_head GEMM, then a kernel of its own (the float32 cast), which
    # the graph's node count shows (one node each here)
    launched = [0]

    def kernel(x):
        launched[0] += 1
        return x

    monkeypatch.setattr(graph_capture, "captured_nodes", lambda: launched[0] if SIMULATED["capturing"] else None)
    lm_head = wrap(kernel, "gemm", lambda x: [gemm.call(x, 128, 32)])
    logits = wrap_around(lambda x: kernel(lm_head(kernel(x))), "lm_head_layer", span_only, span="gemm")
    backend.capture_one(ShapeKey(8), lambda: logits(buffer))
    trace = graph_capture.CAPTURED[(backend, ShapeKey(8))]
    assert [(t.op, t.span, t.tail) for t in trace.templates] == [("gemm", None, 1)]
    graph = ACCOUNTING.graphs[graph_calls(trace, ())]
    assert graph.spans == {} and graph.tails == {0: 1}

    opened = []
    monkeypatch.setattr(graph_capture, "feeds_range", lambda family: opened.append(family) or contextlib.nullcontext())
    monkeypatch.setattr(RECORDER, "active", True)
    layer(buffer)
    assert opened == []  # nothing accounted for
    monkeypatch.setattr(ACCOUNTING, "active", True)
    layer(buffer)
    assert opened == ["gdn"]
    RECORDER.reset()
