"""The routing biases a dummy-weights capture zeroes (fi_profile.capture.dummy_routing): a router's
bias beside or inside a MoE layer, one value per expert; nothing else."""

import torch
from torch import nn

from fi_profile.capture.dummy_routing import ENV_ROUTING, after_dummy_weights, routing_biases, zero_routing_biases


class Experts(nn.Module):
    """A MoE layer: its experts' weights and biases (one row per expert), and a router inside some."""

    def __init__(self, experts: int, hidden: int, router_inside: bool = False) -> None:
        super().__init__()
        self.experts = experts
        self.w13_weight = nn.Parameter(torch.rand(experts, 2 * hidden, hidden))
        self.w13_bias = nn.Parameter(torch.rand(experts, 2 * hidden))
        self.w2_bias = nn.Parameter(torch.rand(experts, hidden))
        if router_inside:
            self.gate = nn.Linear(hidden, experts, bias=True)


class Block(nn.Module):
    """gpt-oss's MLP block (a router linear with a bias), or DeepSeek's (a gate with a correction bias)."""

    def __init__(self, experts: int, hidden: int, correction: bool = False) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=not correction)
        if correction:
            self.router.e_score_correction_bias = nn.Parameter(torch.rand(experts))
        self.shared_gate = nn.Linear(hidden, 1, bias=True)  # one output: no routing
        self.experts = Experts(experts, hidden)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # hidden 8 = experts 8: a norm of that size outside the MoE block is no routing bias
        self.layers = nn.ModuleList([Block(8, 8), Block(8, 8, correction=True)])
        self.norm = nn.LayerNorm(8)
        self.attn = nn.Linear(8, 8, bias=True)


def experts_of(module):
    return {module.experts} if isinstance(module, Experts) else None


def test_a_routers_bias_beside_the_experts_is_found_and_nothing_else():
    model = Model()
    found = routing_biases(model, experts_of)
    assert sorted(found) == ["layers.0.router.bias", "layers.1.router.e_score_correction_bias"]


def test_a_router_inside_the_moe_layer_is_found():
    block = nn.Module()
    block.experts = Experts(4, 8, router_inside=True)
    assert sorted(routing_biases(block, experts_of)) == ["experts.gate.bias"]


def test_zeroing_leaves_the_experts_and_the_other_layers_as_drawn(monkeypatch):
    model = Model()
    before = {name: t.detach().clone() for name, t in model.named_parameters()}
    monkeypatch.setattr("fi_profile.capture.dummy_routing.ZEROED", [])
    zeroed = zero_routing_biases(model, experts_of)
    assert len(zeroed) == 2
    for name, tensor in model.named_parameters():
        if name in zeroed:
            assert torch.count_nonzero(tensor) == 0
        else:
            assert torch.equal(tensor, before[name]), name


def test_the_hook_zeroes_after_the_engine_drew_the_weights_unless_told_to_keep_them(monkeypatch):
    monkeypatch.setattr("fi_profile.capture.dummy_routing.ZEROED", [])
    model = Model()
    with after_dummy_weights(experts_of)(model):
        nn.init.uniform_(model.layers[0].router.bias, 0.5, 1.0)  # the engine's draw, inside the hooked call
        assert torch.count_nonzero(model.layers[0].router.bias) == 8
    assert torch.count_nonzero(model.layers[0].router.bias) == 0

    monkeypatch.setenv(ENV_ROUTING, "engine")
    kept = Model()
    with after_dummy_weights(experts_of)(kept):
        pass
    assert torch.count_nonzero(kept.layers[0].router.bias) == 8
