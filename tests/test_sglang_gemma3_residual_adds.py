"""SGLang 0.5.16's Gemma-3 decoder layer adds each residual in Python between two norms (``norm →
residual + h → norm``); later versions pass the residual to fused norms. Its adds were kernels no
Definition computed (0.7% of Gemma-3-27B's time on an H200, 98.5% attributed). Each add and the
norm that takes its sum are now one ``gemma_fused_add_rmsnorm`` call, with the counts the fused
version gives, and the add's kernels are that call's. The layers here run SGLang's code of both
versions (``sglang/srt/models/gemma3_causal.py``), hooked as the SGLang adapter hooks them."""

import pytest
import torch

from fi_profile.capture.kernel_accounting import ACCOUNTING
from fi_profile.capture.patching import wrap, wrap_around
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import KERNEL_NAMING, rmsnorm
from fi_profile.hooks.sglang import gemma3

HIDDEN, LAYERS, TOKENS = 64, 3, 5


class Gemma3RMSNorm(torch.nn.Module):
    """SGLang's ``Gemma3RMSNorm.forward_native`` (what it runs on CUDA); with a residual as its
    later versions' fused form."""

    def __init__(self) -> None:
        super().__init__()
        self.eps = 1e-6
        self.weight = torch.nn.Parameter(torch.randn(HIDDEN) * 0.1)

    def forward(self, x, residual=None):
        if residual is not None:
            x = residual = x + residual
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        out = (out * (1.0 + self.weight.float())).type_as(x)
        return out if residual is None else (out, residual)


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, Gemma3RMSNorm())
        self.self_attn = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)  # stands for attention
        self.mlp = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.is_sliding = False


class OldLayer(Layer):
    """SGLang 0.5.16's ``Gemma3DecoderLayer.forward``."""

    def forward(self, positions, hidden_states, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.pre_feedforward_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        return (hidden_states,)


class NewLayer(Layer):
    """SGLang 0.5.23's: the residual passed on, the adds fused into the norms."""

    def forward(self, positions, hidden_states, residual=None, **kwargs):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.post_attention_layernorm(self.self_attn(hidden_states))
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return (hidden_states, residual)


class Model(torch.nn.Module):
    def __init__(self, layer: type) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layer() for _ in range(LAYERS))
        self.norm = Gemma3RMSNorm()

    def forward(self, hidden_states):
        residual = None
        for layer in self.layers:
            if isinstance(layer, NewLayer):
                hidden_states, residual = layer(None, hidden_states, residual=residual)
            else:
                hidden_states = layer(None, hidden_states)[0]
        return self.norm(hidden_states) if residual is None else self.norm(hidden_states, residual)[0]


@pytest.fixture
def hooked(monkeypatch):
    """The SGLang adapter's hooks on these classes; recording."""
    monkeypatch.setattr(Gemma3RMSNorm, "forward", wrap(Gemma3RMSNorm.forward, rmsnorm.KEY, gemma3.norm_calls,
                                                       cls=Gemma3RMSNorm))
    for layer in (OldLayer, NewLayer):
        monkeypatch.setattr(layer, "forward", wrap_around(layer.forward, "gemma3_layer", gemma3.decoder_layer_forward,
                                                          cls=layer))
    monkeypatch.setattr(Model, "forward", wrap_around(Model.forward, "gemma3_rope_tables", gemma3.model_forward,
                                                      cls=Model))
    RECORDER.reset()
    monkeypatch.setattr(RECORDER, "active", True)
    yield RECORDER
    RECORDER.active = False
    RECORDER.reset()


PLAIN, FUSED = f"gemma_rmsnorm_h{HIDDEN}", f"gemma_fused_add_rmsnorm_inplace_h{HIDDEN}"


@torch.inference_mode()
def test_old_layers_python_adds_and_the_norms_after_them_are_the_fused_versions_calls(hooked, tmp_path):
    torch.manual_seed(0)
    model, x = Model(OldLayer).to(torch.bfloat16), torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    out = model(x)
    hooked.flush(tmp_path)
    assert not hooked.errors and not hooked.lost_calls
    # per step: the first input norm, and each layer's two post norms plain; the adds feed the
    # pre-feed-forward norms, the later layers' input norms and the final norm
    assert hooked.calls == {PLAIN: 2 * LAYERS + 1, FUSED: 2 * LAYERS}
    new_model = Model(NewLayer).to(torch.bfloat16)
    new_model.load_state_dict(model.state_dict())
    hooked.reset()
    hooked.active = True
    new_out = new_model(x)
    hooked.flush(tmp_path)
    assert hooked.calls == {PLAIN: 2 * LAYERS + 1, FUSED: 2 * LAYERS}  # the same record as the fused version's
    assert torch.equal(out, new_out)  # the same math
    assert torch.equal(out, _unhooked(OldLayer, model.state_dict(), x))  # the mode only watches


def _unhooked(layer: type, state: dict, x: torch.Tensor) -> torch.Tensor:
    RECORDER.active = False
    try:
        model = Model(layer).to(torch.bfloat16)
        model.load_state_dict(state)
        return model(x)
    finally:
        RECORDER.active = True


def test_an_add_of_two_tensors_off_the_residual_stream_is_no_residual_add(hooked, tmp_path):
    """Only an add of the residual stream (the layer's input, then each sum) is one: an add of two
    other tensors of the hidden size, such as a bias, leaves the norm after it plain."""
    norm = Gemma3RMSNorm().to(torch.bfloat16)
    x, y, stream = torch.randn(3, TOKENS, HIDDEN, dtype=torch.bfloat16)
    with gemma3.ResidualAdds(stream):
        norm(x + y)
    hooked.flush(tmp_path)
    assert hooked.calls == {PLAIN: 1}


@pytest.mark.parametrize("watched", [True, False])
@torch.inference_mode()
def test_the_adds_kernels_are_the_fused_calls(hooked, monkeypatch, watched):
    """On the CPU profile (the accounting's rule for a GPU's kernels too): each add's ``aten::add``
    is its fused call's; unwatched (a layer that takes a residual), the adds are not attributed."""
    torch.manual_seed(0)
    if not watched:
        monkeypatch.setattr(gemma3, "adds_residual_in_python", lambda layer_class: False)
    model, x = Model(OldLayer).to(torch.bfloat16), torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    ACCOUNTING.start()
    try:
        model(x)
    finally:
        op_types = {name: d.op_type for name, d in RECORDER.definitions.items()}
        result = ACCOUNTING.stop(op_types, 1, **KERNEL_NAMING)
    launches = {name: entry[1] for name, entry in result.by_definition.items()}
    unattributed = {name: times for name, (times, _) in result.unattributed.items()}
    if watched:  # a fused call: its norm's operators and the add
        assert launches[FUSED] // (2 * LAYERS) == launches[PLAIN] // (2 * LAYERS + 1) + 1
        assert "aten::add" not in unattributed
    else:
        assert FUSED not in launches and unattributed["aten::add"] == 2 * LAYERS
    assert set(unattributed) <= {"aten::add", "aten::linear"}, unattributed
