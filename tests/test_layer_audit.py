"""Layer rules judge everything a layer holds that changes what it computes (issue 42): an
attribute a Definition does not account for is listed by name, never ignored. The attention
layers' audits are in test_attention_variants.py; here the MoE experts'."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fi_profile.families import moe
from fi_profile.hooks.sglang.moe import _experts_problems, swiglu_oai

#: SGLang 0.5.23's ``MoeRunnerConfig`` fields, as its Qwen3-MoE layers set them
PLAIN_RUNNER = dict(num_experts=8, num_local_experts=8, hidden_size=256, intermediate_size_per_partition=128,
                    layer_id=0, top_k=2, num_fused_shared_experts=0, params_dtype=torch.bfloat16,
                    routing_method_type=None, runner_backend=None, activation="silu", is_gated=True,
                    apply_router_weight_on_input=False, inplace=True, no_combine=False,
                    no_combine_keep_router_weight=False, routed_scaling_factor=None, gemm1_alpha=None, gemm1_beta=None,
                    gemm1_clamp_limit=None, swiglu_limit=None, gate_up_interleaved=True, layer=None,
                    use_tp_all_gather_activation=False, silu_mul_keep_fp32=False)


def experts(**runner):
    layer = SimpleNamespace(moe_runner_config=SimpleNamespace(**{**PLAIN_RUNNER, **runner}))
    return layer


def test_sglangs_plain_swiglu_experts_have_nothing_listed():
    assert _experts_problems(experts()) == []


def test_gpt_oss_experts_in_sglang_are_listed_not_recorded_as_plain_swiglu():
    """SGLang 0.5.16 on an H200 recorded gpt-oss-20b's experts (SwiGLU with alpha 1.702, clamped at
    7.0, biased, as its Triton ``matmul_ogs`` runs them) as ``moe_bf16_renorm_topk4_e32_h2880_i2880``,
    a Definition that computes another function: its activation is still called ``silu``."""
    layer = experts(gemm1_alpha=1.702, gemm1_clamp_limit=7.0)
    layer.w13_weight_bias = torch.zeros(8, 256)
    assert _experts_problems(layer) == ["moe_runner_config.gemm1_alpha=1.702",
                                        "moe_runner_config.gemm1_clamp_limit=7.0", "expert bias"]


def test_gpt_oss_experts_with_both_biases_are_recorded_as_its_swigluoai_moe_and_variants_of_them_listed():
    """Alpha, clamp limit and both biases: gpt-oss's experts, recorded with their constants; the
    same with gate and up not interleaved, a beta, or one bias missing is another computation."""
    def gpt_oss(**runner):
        layer = experts(gemm1_alpha=1.702, gemm1_clamp_limit=7.0, **runner)
        layer.w13_weight_bias, layer.w2_weight_bias = torch.zeros(8, 256), torch.zeros(8, 256)
        return layer

    assert swiglu_oai(gpt_oss()) == moe.SwigluOAI(1.702, 7.0) and _experts_problems(gpt_oss()) == []
    assert swiglu_oai(experts(gemm1_alpha=1.5, gemm1_clamp_limit=10.0)) is None  # no biases
    for variant, listed in (({"gate_up_interleaved": False}, "moe_runner_config.gemm1_alpha=1.702"),
                            ({"gemm1_beta": 1.0}, "moe_runner_config.gemm1_beta=1.0")):
        layer = gpt_oss(**variant)
        assert swiglu_oai(layer) is None and listed in _experts_problems(layer), _experts_problems(layer)


def test_a_runner_field_a_later_sglang_adds_is_listed_by_name():
    assert _experts_problems(experts(new_activation_scale=0.5)) == [
        "moe_runner_config.new_activation_scale=0.5 (an attribute fi-profile does not know)"]
    assert _experts_problems(experts(new_flag=False)) == []  # a feature that is off


def _linear_class(module_name: str):
    """A model's own subclass of a linear layer, with a forward of its own defined in ``module_name``."""
    class UnquantizedLinearMethod:
        pass

    def forward(self, x):
        return x

    forward.__module__ = module_name
    cls = type("TinyGemmLinear", (torch.nn.Module,), {"forward": forward})
    layer = cls()
    layer.quant_method = UnquantizedLinearMethod()
    return cls, layer


def test_a_models_linear_subclass_with_a_forward_of_its_own_is_listed_unless_a_hook_records_it():
    """SGLang's gpt-oss router (``TinyGemmLinear``) runs FlashInfer's tinygemm up to 128 tokens past
    its linear method: on an H200 its decode steps' GEMMs were missing from a record that said it
    was complete (it ran its method at prefill, so it was seen). Such a layer is listed by name; with
    its forward hooked (as fi-profile now hooks that one) it is not."""
    from fi_profile.capture.layers import uncovered_layers

    cls, layer = _linear_class("sglang.srt.models.gpt_oss")
    listed = uncovered_layers(torch.nn.Sequential(layer))
    assert list(listed) == ["TinyGemmLinear with a forward of its own (sglang.srt.models.gpt_oss) that may run its "
                            "kernel past its UnquantizedLinearMethod, which no hook records"], listed
    cls.forward.__fi_profile_original__ = lambda self, x: x  # what an installed hook marks
    assert uncovered_layers(torch.nn.Sequential(layer)) == {}
    _, engine_layer = _linear_class("sglang.srt.layers.linear")  # the engine's own linear classes: their method's
    assert uncovered_layers(torch.nn.Sequential(engine_layer)) == {}


def test_sglangs_tinygemm_router_is_one_gemm_with_its_bias_whichever_path_it_takes():
    from fi_profile.hooks.sglang.hook_points import _tiny_gemm_linear

    router = SimpleNamespace(output_size=32, input_size=64, bias=torch.zeros(32), skip_bias_add=False)
    (call,) = _tiny_gemm_linear(router, torch.zeros(5, 64, dtype=torch.bfloat16))
    assert call.definition.name == "gemm_bias_bf16_n32_k64" and call.axes["M"] == 5


def test_torchs_own_layers_in_a_model_are_listed_unless_a_rule_judges_them():
    """SGLang's Gemma-3 embeds its tokens with a subclass of torch's ``nn.Embedding``, past every
    engine layer class: no hook saw it, and the record said nothing of it. torch's own layers with
    weights are listed by name; one a rule judges (and its hook marks) is not; weightless ones run
    no kernel of a layer."""
    from fi_profile.capture.layers import LayerRule, uncovered_layers

    class ScaledEmbedding(torch.nn.Embedding):
        pass

    model = torch.nn.Sequential(ScaledEmbedding(16, 8), torch.nn.Linear(8, 4), torch.nn.LayerNorm(4),
                                torch.nn.LayerNorm(4, elementwise_affine=False), torch.nn.Dropout())
    assert uncovered_layers(model) == {"ScaledEmbedding (a torch nn.Embedding no hook records)": 1,
                                       "Linear (a torch nn.Linear no hook records)": 1,
                                       "LayerNorm (a torch nn.LayerNorm no hook records)": 1}
    rule = LayerRule(f"{__name__}:ScaledEmbedding", lambda layer: None)
    globals()["ScaledEmbedding"] = ScaledEmbedding  # where the rule looks it up
    try:
        assert "ScaledEmbedding (a torch nn.Embedding no hook records)" not in uncovered_layers(model, [rule])
    finally:
        del globals()["ScaledEmbedding"]


def test_a_models_own_layer_with_weights_and_transformers_own_modules_are_listed():
    """vLLM's Command-R norms are a ``LayerNorm`` of its model file: a plain ``nn.Module`` with a
    weight, past every engine and torch layer class; its record named no norm and listed nothing.
    A leaf module of an engine's model code with weights of its own is listed by name, as is a leaf
    module of transformers' code (an engine's Transformers backend runs it: ``GELUTanh``); a
    weightless module of model code (Llama-4's L2 norm is judged by its hook) and containers are not."""
    from fi_profile.capture.layers import uncovered_layers

    class LayerNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))

    class L2Norm(torch.nn.Module):
        pass

    class GELUTanh(torch.nn.Module):
        pass

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.act, self.l2 = LayerNorm(), GELUTanh(), L2Norm()
            self.scale = torch.nn.Parameter(torch.ones(1))  # a container's own weight: its children are judged

    for cls, where in ((LayerNorm, "vllm.model_executor.models.commandr"), (L2Norm, "sglang.srt.models.llama4"),
                       (Block, "vllm.model_executor.models.commandr"), (GELUTanh, "transformers.activations")):
        cls.__module__ = where
    assert uncovered_layers(Block()) == {
        "LayerNorm (a layer of the model's own code, vllm.model_executor.models.commandr, with weights of its own: "
        "no hook records it)": 1,
        "GELUTanh (transformers' own module, which an engine's Transformers modeling backend runs as transformers "
        "wrote it: no hook records it)": 1}


def _gemma3_table(rope_type="default", theta=10000.0, factor=None, scaling=1.0, off=1.0):
    parameters = {"rope_type": rope_type, "rope_theta": theta, **({"factor": factor} if factor else {})}

    def init(config, device):
        inv = 1.0 / theta ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64) / (factor or 1.0)
        return inv * off, scaling

    return SimpleNamespace(rope_type=rope_type, config=SimpleNamespace(rope_parameters=parameters), rope_init_fn=init)


def test_sglangs_gemma3_rope_tables_are_judged_by_their_own_frequencies():
    """SGLang's Gemma-3 rotates by two tables of its own (Hugging Face's ``Gemma3RotaryEmbedding``):
    plain and linear ones are the RoPE Definitions' (their frequencies, made again by the table's own
    function, checked); another rope type, a magnitude, or frequencies its constants do not give are
    listed."""
    from fi_profile.families.rope import RopeParams
    from fi_profile.hooks.sglang.gemma3 import table_params, table_problem

    assert table_problem(_gemma3_table()) is None
    assert table_problem(_gemma3_table("linear", 1e6, factor=8.0)) is None
    assert table_params(_gemma3_table("linear", 1e6, factor=8.0)) == RopeParams(theta=1e6, linear_factor=8.0)
    assert "rope_type 'dynamic'" in table_problem(_gemma3_table("dynamic", factor=2.0))
    assert "attention scaling 1.2" in table_problem(_gemma3_table("default", scaling=1.2))
    assert "inverse frequencies are not its constants'" in table_problem(_gemma3_table(off=1.01))


def _model_layer(name, **held):
    """A layer class of an engine's model code (by its module's name), holding ``held``."""
    cls = type(name, (torch.nn.Module,), {"__module__": "vllm.model_executor.models.some_mup_model"})
    layer = cls()
    layer.__dict__.update(held)
    layer.proj = torch.nn.Identity()
    return layer


def test_a_model_layer_multiplying_in_its_own_code_is_listed_by_each_multiplier():
    """muP models (Granite, Falcon-H1) multiply by numbers their layers hold, in the layers' own
    code, between the hooked calls (``residual + h * residual_multiplier``): no call records it,
    so each such layer is listed by its multipliers, 1.0 too (the code multiplies all the same),
    but those it passes on to a layer judged by its own rule (an attention's softmax scale)."""
    from fi_profile.capture.layers import computes_in_own_code, uncovered_layers

    decoder = _model_layer("MupDecoderLayer", residual_multiplier=0.22, attention_multiplier=0.0078125,
                           mlp_multipliers=[0.88, 1.0], layer_idx=3, use_bias=True)
    assert computes_in_own_code(decoder) == ["residual_multiplier", "mlp_multipliers"]
    assert computes_in_own_code(_model_layer("PlainLayer", residual_multiplier=1.0)) == ["residual_multiplier"]
    assert computes_in_own_code(_model_layer("Flagged", scale_multiplier=True, name_multiplier="x")) == []
    # a layer of the engine's own layers (not model code) is judged by its rules, not by this
    engine_layer = torch.nn.Module()
    engine_layer.residual_multiplier = 0.5
    assert computes_in_own_code(engine_layer) == []
    model = torch.nn.Sequential(decoder, _model_layer("Quiet", attention_multiplier=0.1))
    assert uncovered_layers(model) == {
        "MupDecoderLayer with residual_multiplier, mlp_multipliers (computed in the layer's own code: no hook records "
        "it)": 1}


def test_sglangs_mamba2_mixer_no_definition_computes_is_listed_by_what_it_is():
    """SGLang's Mamba-2 mixer (Nemotron-H, Granite-4.0-H, Falcon-H1) is judged by its rule, on the
    class SGLang builds (in the SGLang the tests run: its venv): one whose heads are no whole number
    per group, or whose activation no conv1d Definition takes, is listed by that, never recorded."""
    import subprocess

    import pytest
    from test_capture_sglang import SGLANG_PYTHON

    if not SGLANG_PYTHON.is_file():
        pytest.skip(f"no SGLang venv at {SGLANG_PYTHON}")  # CI makes one (test_capture_sglang says so)
    probe = ("import torch\n"
             "from types import SimpleNamespace\n"
             "from sglang.srt.layers.attention.mamba.mamba import MambaMixer2\n"
             "from fi_profile.capture.layers import uncovered_layers\n"
             "from fi_profile.hooks.sglang.hook_points import KERNEL_LAYERS, LAYER_RULES\n"
             "def mixer(groups, activation):\n"
             "    m = MambaMixer2.__new__(MambaMixer2)\n"
             "    torch.nn.Module.__init__(m)\n"
             "    m.__dict__.update(num_heads=8, head_dim=64, ssm_state_size=128, n_groups=groups, tp_size=1,\n"
             "                      activation=activation, A=torch.zeros(8), D=torch.ones(8, dtype=torch.bfloat16),\n"
             "                      dt_bias=torch.ones(8, dtype=torch.bfloat16))\n"
             "    return m\n"
             "print(uncovered_layers(torch.nn.Sequential(mixer(3, 'silu'), mixer(2, 'gelu')), LAYER_RULES, KERNEL_LAYERS))\n")
    found = subprocess.run([str(SGLANG_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr[-2000:]
    listed = found.stdout.strip().splitlines()[-1]
    assert "MambaMixer2: Mamba-2 with 8 heads over 3 groups per rank" in listed
    assert "MambaMixer2's causal_conv1d with activation 'gelu'" in listed or "'gelu'" in listed, listed
