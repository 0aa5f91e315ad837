"""A gated attention layer's output gate (Qwen3-Next's, Qwen3.5's full-attention layers): the
Definition made for a layer's heads, its reference and PyTorch baseline, and the watch a layer's hook
runs it in: the layer's sigmoid and the product with its output are one call, and a gated layer whose
gate the watch did not see loses a named call (never a record that looks complete)."""

from types import SimpleNamespace

import pytest
import torch

from fi_profile.capture.recorder import RECORDER
from fi_profile.entry_points import load_function, run_reference
from fi_profile.families import sigmoid_gate_mul
from fi_profile.replay.baseline_solutions import baseline_solutions
from fi_profile.replay.check import compare
from fi_profile.synthesis import synthesize_inputs


def test_a_layers_gate_is_its_heads_times_the_head_size_and_its_reference_and_baseline_agree():
    x = torch.zeros(5, 1024, dtype=torch.bfloat16)
    made = sigmoid_gate_mul.call(x)
    assert made.definition.name == "sigmoid_gate_mul_h1024" and made.axes == {"num_tokens": 5}
    # a compiled layer's hook sees its QKV projection: the gate's width given, its tokens the projection's
    assert sigmoid_gate_mul.call(torch.zeros(7, 3 * 1024, dtype=torch.bfloat16), 1024).definition is made.definition
    assert sigmoid_gate_mul.call(torch.zeros(7, 3072, dtype=torch.float16), 1024).definition.name == \
        "sigmoid_gate_mul_h1024_float16"
    inputs = synthesize_inputs(made.definition, {"num_tokens": 33}, seed=1)
    expected = run_reference(made.definition, inputs)["output"]
    assert torch.equal(expected, (inputs["x"].double() * torch.sigmoid(inputs["gate"].double())).to(torch.bfloat16))
    (torch_baseline,) = [s for s in baseline_solutions(made.definition) if s.name.endswith("__torch")]
    found = load_function(torch_baseline.sources[0].content, "run", label=made.definition.name)(**inputs)
    assert compare(found, expected).ok
    assert not compare(found * 1.05, expected).ok


def test_a_gate_of_one_value_per_token_is_its_own_definition_broadcast_over_the_row():
    """vLLM's Qwen2-MoE shared expert: its output times the sigmoid of its gate's one logit per token."""
    x = torch.zeros(5, 256, dtype=torch.bfloat16)
    made = sigmoid_gate_mul.call(x, gate_size=1)
    assert made.definition.name == "sigmoid_gate_mul_h256_g1" and made.axes == {"num_tokens": 5}
    assert made.definition.axes["gate_size"].value == 1
    assert made.definition is not sigmoid_gate_mul.call(x).definition
    inputs = synthesize_inputs(made.definition, {"num_tokens": 9}, seed=2)
    assert tuple(inputs["gate"].shape) == (9, 1)
    expected = run_reference(made.definition, inputs)["output"]
    assert torch.equal(expected, (inputs["x"].double() * torch.sigmoid(inputs["gate"].double())).to(torch.bfloat16))
    (torch_baseline,) = [s for s in baseline_solutions(made.definition) if s.name.endswith("__torch")]
    found = load_function(torch_baseline.sources[0].content, "run", label=made.definition.name)(**inputs)
    assert compare(found, expected).ok
    # each token's one gate value: a gate taken per element instead is another output
    assert not compare(inputs["x"] * torch.sigmoid(inputs["gate"].roll(1, 0)), expected).ok


def test_a_gate_of_another_shape_is_named():
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    assert sigmoid_gate_mul.problem(x, torch.zeros(4, 256, dtype=torch.bfloat16)) is None
    assert sigmoid_gate_mul.problem(x, torch.zeros(4, 1, dtype=torch.bfloat16)) is None
    assert "(4, 16)" in sigmoid_gate_mul.problem(x, torch.zeros(4, 16, dtype=torch.bfloat16))  # per head: none
    assert "(3, 256)" in sigmoid_gate_mul.problem(x, torch.zeros(3, 256, dtype=torch.bfloat16))
    assert "float32" in sigmoid_gate_mul.problem(x, torch.zeros(4, 1, dtype=torch.float32))


@pytest.fixture
def recording():
    was = RECORDER.active
    RECORDER.active = True
    lost = dict(RECORDER.lost_calls)
    try:
        yield
    finally:
        RECORDER.active = was
        RECORDER.lost_calls.clear()
        RECORDER.lost_calls.update(lost)


def test_the_watch_sees_the_sigmoid_and_its_product_and_leaves_other_products_alone(recording, monkeypatch):
    seen = []
    monkeypatch.setattr(sigmoid_gate_mul, "_gated_product", lambda compute, x, gate: seen.append((x, gate)) or compute())
    layer = SimpleNamespace(attn_output_gate=True)
    attention, gate = torch.randn(3, 8), torch.randn(3, 8)
    with sigmoid_gate_mul.watched(layer):
        other = attention * 2.0  # not the gate's
        gated = attention * torch.sigmoid(gate)
    assert torch.equal(gated, attention * torch.sigmoid(gate)) and torch.equal(other, attention * 2.0)
    assert len(seen) == 1 and seen[0][0] is attention


def test_a_gated_layer_whose_gate_was_not_seen_loses_a_named_call(recording):
    before = RECORDER.lost_calls[sigmoid_gate_mul.KEY]
    with sigmoid_gate_mul.watched(SimpleNamespace(attn_output_gate=True)):
        torch.randn(3, 8) * 2.0  # a layer whose gate ran in a kernel of its own
    assert RECORDER.lost_calls[sigmoid_gate_mul.KEY] == before + 1
    with sigmoid_gate_mul.watched(SimpleNamespace(attn_output_gate=False)):  # no gate: nothing watched, nothing lost
        torch.randn(3, 8) * 2.0
    assert RECORDER.lost_calls[sigmoid_gate_mul.KEY] == before + 1


class GatedAttention(torch.nn.Module):
    """A gated attention layer: projections of its own, its gate in its forward."""

    def __init__(self, gated=True):
        super().__init__()
        self.attn_output_gate = gated
        self.o_proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.o_proj(x * torch.sigmoid(x))


class FusedGateAttention(GatedAttention):
    """A subclass whose own forward runs the gate in a kernel of its own (as Qwen3.5's in SGLang)."""

    def forward(self, x):
        return self.o_proj(x)


def test_a_gated_layer_no_rule_knows_is_listed_by_its_flag_and_a_watched_one_is_not(monkeypatch):
    """Every layer with ``attn_output_gate`` set is listed unless a rule judges its class; the rule
    for a watched class lists a subclass whose own forward the watch never sees."""
    from fi_profile.capture.layers import LayerRule, uncovered_layers
    from fi_profile.capture.patching import wrap_around

    def linear_problem(layer):
        return None

    model = torch.nn.Sequential(GatedAttention(), GatedAttention(gated=False), FusedGateAttention())
    linear = LayerRule("torch.nn.modules.linear:Linear", linear_problem)
    listed = uncovered_layers(model, [linear])
    assert listed == {"GatedAttention with attn_output_gate (computed in the layer's own code: no hook records it)": 1,
                      "FusedGateAttention with attn_output_gate (computed in the layer's own code: no hook records it)": 1}
    monkeypatch.setattr(GatedAttention, "forward", wrap_around(GatedAttention.forward, "watch",
                                                               sigmoid_gate_mul.watched))
    rule = LayerRule(f"{__name__}:GatedAttention", sigmoid_gate_mul.layer_problem("forward"), container=True)
    assert uncovered_layers(model, [linear, rule]) == {
        "FusedGateAttention with attn_output_gate in a forward of its own (its sigmoid and product: no hook records "
        "them)": 1}


class SharedExpertMLP(torch.nn.Module):
    """A shared expert as vLLM's Qwen2-MoE MLP runs it: its output times the sigmoid of its gate's
    one logit per token."""

    def __init__(self):
        super().__init__()
        self.down_proj = torch.nn.Linear(8, 8)
        self.expert_gate = torch.nn.Linear(8, 1, bias=False)

    def forward(self, x):
        out = self.down_proj(x)
        return torch.nn.functional.sigmoid(self.expert_gate(x)) * out


def test_a_shared_experts_gate_is_watched_unless_its_moe_call_records_it(recording, monkeypatch):
    from fi_profile.capture.layers import record_by

    seen = []
    monkeypatch.setattr(sigmoid_gate_mul, "_gated_product", lambda compute, x, gate: seen.append((x, gate)) or compute())
    mlp, x = SharedExpertMLP(), torch.randn(3, 8)
    with torch.no_grad(), sigmoid_gate_mul.watched(mlp):
        mlp(x)
    assert len(seen) == 1 and tuple(seen[0][0].shape) == (3, 8) and tuple(seen[0][1].shape) == (3, 1)
    assert sigmoid_gate_mul._gate_calls(*seen[0])[0].definition.name == "sigmoid_gate_mul_h8_g1_float32"
    record_by("moe", mlp.expert_gate)  # vLLM's opaque MoE op runs it: the MoE call records the gate
    with torch.no_grad(), sigmoid_gate_mul.watched(mlp):
        mlp(x)
    assert len(seen) == 1


def test_a_gated_mlp_no_rule_knows_is_listed_by_its_gate_layer(monkeypatch):
    from fi_profile.capture.layers import LayerRule, uncovered_layers
    from fi_profile.capture.patching import wrap_around

    def linear_problem(layer):
        return None

    linear = LayerRule("torch.nn.modules.linear:Linear", linear_problem)
    model = torch.nn.Sequential(SharedExpertMLP())
    assert uncovered_layers(model, [linear]) == {
        "SharedExpertMLP with expert_gate (computed in the layer's own code: no hook records it)": 1}
    monkeypatch.setattr(SharedExpertMLP, "forward", wrap_around(SharedExpertMLP.forward, "watch",
                                                                sigmoid_gate_mul.watched))
    rule = LayerRule(f"{__name__}:SharedExpertMLP", sigmoid_gate_mul.layer_problem("forward"), container=True)
    assert uncovered_layers(model, [linear, rule]) == {}
