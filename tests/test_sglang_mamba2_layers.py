"""How SGLang's Mamba-2 hook judges a mixer and reads a step (``hooks/sglang/mamba2.py``), on
stand-ins with the attributes SGLang 0.5.16 and 0.5.23 give ``MambaMixer2`` and its
``Mamba2Metadata``: a mixed step (prefills, then decodes), a CUDA graph's decode replayed from its
step's batch, and what no Definition computes, named."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fi_profile.hooks.sglang import mamba2
from fi_profile.hooks.sglang.attention import STEP

SSU, SSD = "mamba_ssu_decode_h8_d64_s128_ng2_state_float32", "mamba_ssd_prefill_h8_d64_s128_ng2_state_float32"


class MambaMixer2(torch.nn.Module):
    """Nemotron-H's tiny mixer at TP 1: 8 heads of 64 over 2 groups, a state of 128, conv width 4."""

    def __init__(self, **changed) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.ssm_state_size, self.n_groups, self.tp_size = 8, 64, 128, 2, 1
        self.intermediate_size, self.conv_dim, self.activation = 512, 1024, "silu"
        self.conv1d = SimpleNamespace(input_size=4, bias=torch.zeros(1024), weight=torch.zeros(0))  # repacked: empty
        self.A = torch.zeros(8)
        self.D, self.dt_bias = torch.ones(8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
        self.__dict__.update(changed)


def _cache(slots: int = 9) -> SimpleNamespace:
    return SimpleNamespace(conv=[torch.zeros(slots, 1024, 3, dtype=torch.bfloat16)],
                           temporal=torch.zeros(slots, 8, 64, 128))


def _metadata(prefill_lengths=(), decodes=0, **changed) -> SimpleNamespace:
    prefills = len(prefill_lengths)
    mixed = SimpleNamespace(extend_seq_lens_cpu=list(prefill_lengths),
                            has_initial_states=torch.tensor([i % 2 == 1 for i in range(prefills)])) if prefills else None
    fields = dict(num_prefills=prefills, num_decodes=decodes, num_prefill_tokens=sum(prefill_lengths),
                  mamba_cache_indices=torch.tensor([6, 3, 8, 1, 4]), mixed_metadata=mixed, is_target_verify=False,
                  replayssm_write_pos=None)
    return SimpleNamespace(**{**fields, **changed})


def test_a_nemotron_h_mixer_is_the_mamba_definitions_and_what_it_is_not_is_named():
    assert mamba2.layer_problem(MambaMixer2()) is None
    assert "ShortConv" in mamba2.layer_problem(type("ShortConv", (torch.nn.Module,), {})())
    assert "8 heads over 3 groups" in mamba2.layer_problem(MambaMixer2(n_groups=3))
    assert "its A in torch.bfloat16" in mamba2.layer_problem(MambaMixer2(A=torch.zeros(8, dtype=torch.bfloat16)))
    assert "activation 'relu'" in mamba2.layer_problem(MambaMixer2(activation="relu"))
    assert "float16 activations" in mamba2.layer_problem(MambaMixer2(), torch.float16)


def test_a_mixed_step_is_the_prefills_conv1d_and_scan_then_the_decodes_update_and_state_update():
    layer, metadata = MambaMixer2(), _metadata(prefill_lengths=(5, 3), decodes=2)
    conv_p, ssd, conv_d, ssu = mamba2.layer_calls(layer, torch.zeros(10, 256, dtype=torch.bfloat16), _cache(),
                                                 metadata)
    assert conv_p.definition.name == "causal_conv1d_prefill_c1024_w4_silu_bias" and ssd.definition.name == SSD
    assert ssd.axes == {"total_seq_len": 8, "num_seqs": 2, "len_cu_seqlens": 3, "state_cache_size": 9}
    assert ssd.tensors["cu_seqlens"].tolist() == [0, 5, 8]
    assert ssd.tensors["state_indices"]().tolist() == [6, 3]
    assert ssd.tensors["has_initial_state"]().tolist() == [False, True]
    assert conv_d.definition.name == "causal_conv1d_decode_c1024_w4_silu_bias" and ssu.definition.name == SSU
    assert ssu.axes == {"batch_size": 2, "state_cache_size": 9}
    assert ssu.tensors["state_batch_indices"]().tolist() == conv_d.tensors["conv_state_indices"]().tolist() == [8, 1]


def test_under_tensor_parallelism_the_mixer_is_its_ranks_heads_groups_and_channels():
    layer = MambaMixer2(tp_size=2)
    calls = mamba2.layer_calls(layer, torch.zeros(1, 256, dtype=torch.bfloat16), _cache(), _metadata(decodes=1))
    assert [c.definition.name for c in calls] == ["causal_conv1d_decode_c512_w4_silu_bias",
                                                  "mamba_ssu_decode_h4_d64_s128_ng1_state_float32"]


def test_a_captured_decode_is_built_from_each_replayed_steps_batch_and_the_backends_slots():
    class Mode:
        def __init__(self, kind):
            self.kind = kind

        def is_decode(self):
            return self.kind == "decode"

        def is_extend(self):
            return self.kind == "extend"

    backend = SimpleNamespace(forward_metadata=_metadata(decodes=8))
    build = mamba2.captured_layer_calls(MambaMixer2(), torch.zeros(8, 256, dtype=torch.bfloat16), _cache(),
                                        _metadata(decodes=8))
    try:
        STEP.begin(runner=SimpleNamespace(attn_backend=SimpleNamespace(linear_attn_backend=backend)),
                   batch=SimpleNamespace(forward_mode=Mode("decode"), batch_size=3))
        conv, ssu = build()
        assert ssu.axes == {"batch_size": 3, "state_cache_size": 9}
        assert ssu.tensors["state_batch_indices"]().tolist() == [6, 3, 8]
        STEP.begin(runner=SimpleNamespace(attn_backend=SimpleNamespace(linear_attn_backend=backend)),
                   batch=SimpleNamespace(forward_mode=Mode("idle"), batch_size=0))
        assert build() == []
        backend.forward_metadata = _metadata(decodes=3, is_target_verify=True)
        STEP.begin(runner=SimpleNamespace(attn_backend=SimpleNamespace(linear_attn_backend=backend)),
                   batch=SimpleNamespace(forward_mode=Mode("decode"), batch_size=3))
        with pytest.raises(NotImplementedError, match="speculative"):
            build()
    finally:
        STEP.begin()
    with pytest.raises(RuntimeError, match="outside a model step"):
        build()


@pytest.mark.parametrize("changed, named", [
    ({"mup_vector": torch.ones(1544)}, "muP vector"),
    ({"metadata": _metadata(decodes=1, replayssm_write_pos=torch.zeros(1))}, "ReplaySSM"),
    ({"metadata": _metadata(decodes=1, is_target_verify=True)}, "speculative"),
    ({"layer_cache": SimpleNamespace(conv=[torch.zeros(9, 1024, 3)], temporal=torch.zeros(9, 8, 64, 128,
                                                                                          dtype=torch.float16))},
     "float16 state cache"),
])
def test_a_step_no_definition_computes_is_named_never_recorded(changed, named):
    arguments = {"hidden_states": torch.zeros(1, 256, dtype=torch.bfloat16), "layer_cache": _cache(),
                 "metadata": _metadata(decodes=1), **changed}
    with pytest.raises(NotImplementedError, match=named):
        mamba2.layer_calls(MambaMixer2(), **arguments)
