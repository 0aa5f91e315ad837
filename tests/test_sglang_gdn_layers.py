"""How SGLang's Gated DeltaNet hook judges a layer and reads a step (``hooks/sglang/gdn.py``), on
stand-ins with the attributes SGLang 0.5.16 and 0.5.23 give them: what it does not know is listed
by name, never recorded as the nearest Definition."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fi_profile.hooks.sglang import gdn
from fi_profile.hooks.sglang.attention import STEP


class RadixLinearAttention(torch.nn.Module):
    def __init__(self, **changed) -> None:
        super().__init__()
        self.layer_id, self.num_q_heads, self.num_k_heads, self.num_v_heads = 0, 2, 2, 4
        self.head_q_dim = self.head_k_dim = self.head_v_dim = 128
        self.q_dim, self.k_dim, self.v_dim = 256, 256, 512
        self.conv_weights = torch.nn.Parameter(torch.zeros(1024, 1, 4)).squeeze(1)
        self.bias, self.activation = None, "silu"
        self.A_log, self.dt_bias, self.lower_bound = torch.zeros(4), torch.zeros(4), None
        self.__dict__.update(changed)


class GDNAttnBackend:
    def __init__(self) -> None:
        pool = SimpleNamespace(mamba2_layer_cache=lambda layer_id: SimpleNamespace(conv=[torch.zeros(9, 1024, 3)]))
        self.req_to_token_pool = pool
        self.forward_metadata = SimpleNamespace(mamba_cache_indices=torch.tensor([5, 2, 7, 0]))
        self.mis_metadata = None


class Mode:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def is_decode(self) -> bool:
        return self.kind == "decode"

    def is_extend(self) -> bool:
        return self.kind in ("extend", "verify")

    def is_target_verify(self) -> bool:
        return self.kind == "verify"


@pytest.fixture
def step():
    def begin(backend=None, **batch):
        STEP.begin(runner=SimpleNamespace(attn_backend=SimpleNamespace(linear_attn_backend=backend or GDNAttnBackend())))
        return SimpleNamespace(**batch)

    yield begin
    STEP.begin()


def test_a_qwen3_next_layer_is_the_gdn_definitions_and_what_else_it_holds_is_listed_by_name():
    assert gdn.layer_problem(RadixLinearAttention()) is None
    assert "lower_bound" in gdn.layer_problem(RadixLinearAttention(lower_bound=-5.0))  # Kimi's KDA gate
    assert "window=8 (an attribute fi-profile does not know)" in gdn.layer_problem(RadixLinearAttention(window=8))
    assert "key/value heads of 64/64" in gdn.layer_problem(RadixLinearAttention(head_q_dim=64, head_k_dim=64,
                                                                                 head_v_dim=64))
    assert "activation 'relu'" in gdn.layer_problem(RadixLinearAttention(activation="relu"))


def test_a_decode_step_is_one_conv1d_update_and_one_recurrence_over_its_requests(step):
    batch = step(forward_mode=Mode("decode"), batch_size=3)
    conv, recurrence = gdn._calls(RadixLinearAttention(), batch, torch.bfloat16)
    assert conv.definition.name == "causal_conv1d_decode_c1024_w4_silu"
    assert conv.axes == {"batch_size": 3, "state_cache_size": 9}
    assert conv.tensors["conv_state_indices"]().tolist() == [5, 2, 7]
    assert recurrence.definition.name == "gdn_decode_qk2_v4_d128_k_last" and recurrence.axes == {"batch_size": 3}


def test_an_extend_step_is_one_conv1d_and_one_chunked_rule_over_all_its_requests(step):
    batch = step(forward_mode=Mode("extend"), extend_seq_lens_cpu=[5, 1, 7], extend_prefix_lens=torch.tensor([0, 4, 0]))
    conv, recurrence = gdn._calls(RadixLinearAttention(bias=torch.zeros(1024)), batch, torch.bfloat16)
    assert conv.definition.name == "causal_conv1d_prefill_c1024_w4_silu_bias"
    assert conv.tensors["cu_seqlens"].tolist() == [0, 5, 6, 13]
    assert conv.tensors["has_initial_state"]().tolist() == [False, True, False]
    assert conv.tensors["conv_state_indices"]().tolist() == [5, 2, 7]
    assert recurrence.definition.name == "gdn_prefill_qk2_v4_d128_k_last"
    assert recurrence.tensors["cu_seqlens"].tolist() == [0, 5, 6, 13]


def test_other_backends_speculative_steps_and_float_activations_are_named_errors(step):
    class KimiLinearAttnBackend(GDNAttnBackend):
        pass

    with pytest.raises(NotImplementedError, match="KimiLinearAttnBackend"):
        gdn._calls(RadixLinearAttention(), step(KimiLinearAttnBackend(), forward_mode=Mode("decode"), batch_size=1),
                   torch.bfloat16)
    with pytest.raises(NotImplementedError, match="gdn_mtp"):
        gdn._calls(RadixLinearAttention(), step(forward_mode=Mode("verify"), batch_size=1), torch.bfloat16)
    with pytest.raises(NotImplementedError, match="float32"):
        gdn._calls(RadixLinearAttention(), step(forward_mode=Mode("decode"), batch_size=1), torch.float32)


def test_the_gated_norms_gate_and_weight_are_judged():
    norm = SimpleNamespace(elementwise_affine=True, activation="silu", bias=None)
    assert gdn.fused_norm_problem(norm) is None
    assert "a sigmoid gate" in gdn.fused_norm_problem(SimpleNamespace(**{**vars(norm), "activation": "sigmoid"}))
    assert "no weight" in gdn.fused_norm_problem(SimpleNamespace(**{**vars(norm), "elementwise_affine": False}))


def test_the_shared_experts_fused_gate_is_one_call_and_its_linear_layer_is_covered_by_its_weight():
    from fi_profile.capture.layers import SEEN_WEIGHTS
    from fi_profile.hooks.sglang import moe

    gate = torch.nn.Linear(256, 1, bias=False)
    x = torch.zeros(5, 256, dtype=torch.bfloat16)
    (call,) = moe.shared_expert_gate_calls(x, gate.weight.squeeze(), x, x)
    assert call.definition.name == "shared_expert_gate_sigmoid_mul_add_h256" and call.axes == {"num_tokens": 5}
    assert id(gate.weight) in SEEN_WEIGHTS
    with pytest.raises(NotImplementedError, match="gate weight of shape"):
        moe.shared_expert_gate_calls(x, torch.zeros(2, 256), x, x)
    assert moe.one_output_linear_problem(gate) is None
    assert "no hook records" in moe.one_output_linear_problem(torch.nn.Linear(256, 1, bias=True))
    assert "no hook records" in moe.one_output_linear_problem(torch.nn.Linear(256, 8, bias=False))


def test_the_gated_norms_triton_kernel_is_the_norms():
    """SGLang 0.5.16's gated norm on an H100 ran ``layer_norm_gated_fwd_kernel`` (0.9% of
    Qwen3-Next's time, attributed to no Definition before)."""
    from fi_profile.capture.kernel_accounting import words_fit
    from fi_profile.families import gdn as gdn_family
    from fi_profile.families import rmsnorm

    assert words_fit("layer_norm_gated_fwd_kernel", rmsnorm.FAMILY.kernel_words)
    assert not words_fit("layer_norm_gated_fwd_kernel", gdn_family.FAMILY.kernel_words)
