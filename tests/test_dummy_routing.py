"""The biases a dummy-weights capture zeroes (fi_profile.capture.dummy_routing): in a model with MoE
layers every bias (a router's, a correction bias, the projections' and the experts'), in a dense
model none; no other tensor."""

import torch
from torch import nn

from fi_profile.capture.dummy_routing import ENV_ROUTING, after_dummy_weights, dummy_biases, zero_dummy_biases


class Experts(nn.Module):
    """A MoE layer: its experts' weights and biases (one row per expert)."""

    def __init__(self, experts: int, hidden: int) -> None:
        super().__init__()
        self.w13_weight = nn.Parameter(torch.rand(experts, 2 * hidden, hidden))
        self.w13_bias = nn.Parameter(torch.rand(experts, 2 * hidden))


class Block(nn.Module):
    """gpt-oss's MLP block (a router linear with a bias), or DeepSeek's (a gate with a correction bias)."""

    def __init__(self, experts: int, hidden: int, correction: bool = False) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=not correction)
        if correction:
            self.router.e_score_correction_bias = nn.Parameter(torch.rand(experts))
        self.experts = Experts(experts, hidden)


class Model(nn.Module):
    def __init__(self, moe: bool = True) -> None:
        super().__init__()
        self.attn = nn.Linear(8, 8, bias=True)
        self.norm = nn.LayerNorm(8)
        self.layers = nn.ModuleList([Block(4, 8), Block(4, 8, correction=True)] if moe else [nn.Linear(8, 8)])
        self.register_buffer("steps", torch.arange(4))  # an integer buffer: never a bias


def is_moe(module):
    return isinstance(module, Experts)


def test_a_moe_models_biases_are_every_bias_it_has():
    found = dummy_biases(Model(), is_moe)
    assert sorted(found) == ["attn.bias", "layers.0.experts.w13_bias", "layers.0.router.bias",
                             "layers.1.experts.w13_bias", "layers.1.router.e_score_correction_bias", "norm.bias"]


def test_a_dense_models_biases_are_left_as_drawn():
    assert dummy_biases(Model(moe=False), is_moe) == {}


def test_zeroing_leaves_every_other_tensor_as_drawn(monkeypatch):
    model = Model()
    before = {name: t.detach().clone() for name, t in model.named_parameters()}
    monkeypatch.setattr("fi_profile.capture.dummy_routing.ZEROED", [])
    zeroed = zero_dummy_biases(model, is_moe)
    assert len(zeroed) == 6
    for name, tensor in model.named_parameters():
        if name in zeroed:
            assert torch.count_nonzero(tensor) == 0
        else:
            assert torch.equal(tensor, before[name]), name


def test_the_hook_zeroes_after_the_engine_drew_the_weights_unless_told_to_keep_them(monkeypatch):
    monkeypatch.setattr("fi_profile.capture.dummy_routing.ZEROED", [])
    model = Model()
    with after_dummy_weights(is_moe)(model):
        nn.init.uniform_(model.layers[0].router.bias, 0.5, 1.0)  # the engine's draw, inside the hooked call
        assert torch.count_nonzero(model.layers[0].router.bias) == 4
    assert torch.count_nonzero(model.layers[0].router.bias) == 0

    monkeypatch.setenv(ENV_ROUTING, "engine")
    kept = Model()
    with after_dummy_weights(is_moe)(kept):
        pass
    assert torch.count_nonzero(kept.layers[0].router.bias) == 4


def test_a_failure_to_zero_never_stops_the_engine(monkeypatch):
    monkeypatch.setattr("fi_profile.capture.dummy_routing.ZEROED", [])

    def broken(module):
        raise ImportError("the engine moved its MoE layer")

    import pytest

    with pytest.warns(RuntimeWarning, match="not zeroed"):
        with after_dummy_weights(broken)(Model()):
            pass
