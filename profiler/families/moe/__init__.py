"""A fused MoE layer: softmax top-k routing (weights renormalized or not), DeepSeek's routing
(sigmoid scores, a correction bias choosing among the best expert groups, routed scaling), or
Llama-4's (the top-k logits through a sigmoid, weighting each expert's input), and
SwiGLU experts (or gpt-oss's biased experts with its clamped SwiGLU, ``swigluoai``), as one call.
Op type ``moe``; hooked where each engine's MoE layer runs (vLLM's ``MoERunner``,
SGLang's ``TopK`` then ``FusedMoE``). What a layer does beyond that is said by
:func:`problems`, which both engines fill from their layers' attributes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import SHORT_DTYPES, KernelCall, cached_definition, rows
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.families.moe import fp8_block
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype
from fi_profile.schema.reference import reference_constant

KEY = "moe"

#: routing -> the shipped Definition whose reference routes that way (instantiated per shape)
TEMPLATES = {
    "renorm": "moe_bf16_renorm_topk2_e8_h4096_i14336",  # softmax, top-k, weights renormalized
    "softmax": "moe_bf16_softmax_topk8_e64_h2048_i1024",  # softmax, top-k, weights as they are
    "ds_routing": "moe_bf16_ds_routing_topk8_ng8_kg4_e256_h7168_i2048",  # DeepSeek-V3's
    # DeepSeek-V3's with its shared expert fused in as one more expert (SGLang on CUDA)
    "ds_routing_shared": "moe_bf16_ds_routing_topk8_ng8_kg4_e256_h7168_i2048_shared1",
    # softmax top-k with a shared expert fused in as one more expert, weighted by the sigmoid of its
    # gate (SGLang's Qwen3-Next on CUDA)
    "renorm_shared_gate": "moe_bf16_renorm_topk10_e512_h2048_i512_shared1_sigmoid_gate",
    # DeepSeek-V3's under expert parallelism: a rank's experts from local_expert_offset on (EP=8)
    "ds_routing_ep": "moe_bf16_ds_routing_topk8_ng8_kg4_e32_h7168_i2048_ep8",
    # gpt-oss-20b's: softmax top-k, renormalized; biased experts with its SwiGLU on interleaved rows
    "renorm_swigluoai": "moe_bf16_renorm_topk4_e32_h2880_i2880_swigluoai_bias",
    # the same with MXFP4 expert weights, as gpt-oss ships
    "renorm_swigluoai_mxfp4": "moe_mxfp4_renorm_topk4_e32_h2880_i2880_swigluoai_bias",
    # Llama-4-Scout's: sigmoid of the top-k logits, the weight on the experts' input
    "llama4_routing": "moe_bf16_llama4_routing_topk1_e16_h5120_i8192",
}


@dataclass(frozen=True)
class SwigluOAI:
    """gpt-oss's expert activation (``swigluoai``) on gate and up rows interleaved: the gate clamped
    above at ``limit``, the up part to [-limit, limit], ``gate * sigmoid(alpha * gate) * (up + 1)``;
    its experts' GEMMs add biases (the Definitions take them as inputs)."""

    alpha: float = 1.702
    limit: float = 7.0

    def suffix(self) -> str:
        """What the name says: ``_swigluoai`` with gpt-oss's constants, and others by value."""
        said = "" if (self.alpha, self.limit) == (1.702, 7.0) else f"_a{self.alpha:g}_l{self.limit:g}".replace(".", "p")
        return f"_swigluoai{said}_bias"


@dataclass(frozen=True)
class DeepSeekRouting:
    """DeepSeek's routing (``topk_method: noaux_tc``): sigmoid scores, ``n_group`` groups of which
    the ``topk_group`` best (by their two best biased scores) are kept, weights renormalized or not,
    times ``routed_scaling_factor`` (applied to the weights or to the routed output: the same sum)."""

    n_group: int
    topk_group: int
    renormalize: bool
    routed_scaling_factor: float


@dataclass(frozen=True)
class LocalExperts:
    """Expert parallelism: the rank holds ``count`` of the routed experts, global ``offset`` on."""

    offset: int
    count: int


def call(hidden_states: torch.Tensor, routing_logits: torch.Tensor, num_experts: int, top_k: int,
         intermediate_size: int, renormalize: bool, deepseek: Optional[DeepSeekRouting] = None,
         routing_bias: Optional[torch.Tensor] = None, shared_experts: int = 0,
         local: Optional[LocalExperts] = None, swiglu_oai: Optional[SwigluOAI] = None,
         llama4: bool = False, mxfp4: bool = False, shared_gate: Optional[torch.Tensor] = None) -> KernelCall:
    """A fused MoE layer (routing + SwiGLU experts) with a softmax top-k router, or with DeepSeek's
    routing (``deepseek``, its correction bias ``routing_bias``; ``shared_experts`` fused after the
    ``num_experts`` routed ones, each token's extra slot beyond its ``top_k`` routed; ``local``: the
    rank's experts under expert parallelism, whose part of the sum the layer computes);
    ``swiglu_oai``: gpt-oss's biased experts (beside a softmax router only); ``llama4``: Llama-4's
    routing (sigmoid of the top-k logits, weighting the experts' input), ``renormalize`` off;
    ``mxfp4``: gpt-oss's experts with MXFP4 weights, as it ships (:data:`MXFP4_BLOCK`);
    ``shared_gate``: beside a softmax router, the weight ([shared, hidden]) of the gate whose logits'
    sigmoid weighs each token's fused ``shared_experts`` (Qwen2-MoE's and Qwen3-Next's, fused by
    SGLang); the logits are the Definition's input (the gate's linear layer is a GEMM call)."""
    if mxfp4:
        found = mxfp4_problems(hidden_states.shape[-1], intermediate_size, hidden_states.dtype)
        if swiglu_oai is None:
            found.insert(0, "MXFP4 experts other than gpt-oss's (biased, swigluoai)")
        if found:
            raise NotImplementedError(f"MoE layer without a Definition: {', '.join(found)}")
    if shared_gate is not None:
        beside = [what for what, applies in {
            "DeepSeek's routing": deepseek is not None, "Llama-4's routing": llama4,
            "swigluoai or MXFP4 experts": swiglu_oai is not None or mxfp4,
            f"hidden size {hidden_states.shape[-1]}":
                tuple(shared_gate.shape) != (shared_experts, hidden_states.shape[-1])}.items() if applies]
        if beside:
            raise NotImplementedError(f"MoE layer without a Definition: {shared_experts} fused shared experts with a "
                                      f"gate weight of shape {tuple(shared_gate.shape)}, beside {', '.join(beside)}")
    if shared_experts and (deepseek is None or shared_experts != 1) and shared_gate is None:
        raise NotImplementedError(f"MoE layer without a Definition: {shared_experts} fused shared experts"
                                  + ("" if deepseek is not None else " beside a softmax router, without a gate"))
    if local is not None and (deepseek is None or shared_experts):
        raise NotImplementedError("MoE layer without a Definition: expert parallelism beside "
                                  + ("fused shared experts" if deepseek is not None else "a softmax router"))
    if swiglu_oai is not None and (deepseek is not None or local is not None or shared_experts):
        raise NotImplementedError("MoE layer without a Definition: swigluoai experts beside DeepSeek's routing, "
                                  "shared experts or expert parallelism")
    if llama4 and (deepseek is not None or local is not None or shared_experts or swiglu_oai is not None or renormalize):
        raise NotImplementedError("MoE layer without a Definition: Llama-4's routing beside DeepSeek's, shared experts "
                                  "fused in, expert parallelism, swigluoai experts or renormalized weights")
    if local is not None and (num_experts % local.count or not 0 <= local.offset <= num_experts - local.count):
        raise NotImplementedError(f"MoE layer without a Definition: {local.count} experts from {local.offset} on "
                                  f"of {num_experts} (no even expert-parallel split)")
    hidden = hidden_states.shape[-1]
    routing = ("ds_routing" if deepseek is not None else "llama4_routing" if llama4
               else "renorm" if renormalize else "softmax")
    bias_dtype = routing_bias.dtype if routing_bias is not None else None

    def build() -> Definition:
        dtype = schema_dtype(hidden_states.dtype)
        logits_dtype = schema_dtype(routing_logits.dtype)
        if dtype not in SHORT_DTYPES:
            raise NotImplementedError(f"MoE in {dtype.value}: only unquantized bf16/fp16/fp32 MoE has a Definition")
        consts = {"num_experts": num_experts, "top_k": top_k, "hidden_size": hidden,
                  "intermediate_size": intermediate_size, "gemm1_out_size": 2 * intermediate_size}
        shape = f"e{num_experts}_h{hidden}_i{intermediate_size}"
        if deepseek is None:
            logits = "" if logits_dtype is dtype else f"_logits_{SHORT_DTYPES.get(logits_dtype, logits_dtype.value)}"
            if swiglu_oai is not None:
                input_dtypes = {"routing_logits": logits_dtype}
                template, weights = "renorm_swigluoai", SHORT_DTYPES[dtype]
                if mxfp4:
                    template, weights = "renorm_swigluoai_mxfp4", "mxfp4"
                    consts.update(num_hidden_blocks=hidden // MXFP4_BLOCK,
                                  num_intermediate_blocks=intermediate_size // MXFP4_BLOCK)
                    input_dtypes.update({f"gemm{n}_{part}": kind for n in (1, 2)
                                         for part, kind in (("weights", DType.float4_e2m1), ("scales", DType.int8))})
                return definition_for(TEMPLATES[template],
                                      f"moe_{weights}_{routing}_topk{top_k}_{shape}{swiglu_oai.suffix()}{logits}",
                                      consts, dtype, {"RENORMALIZE": renormalize, "ALPHA": float(swiglu_oai.alpha),
                                                      "LIMIT": float(swiglu_oai.limit)},
                                      input_dtypes=input_dtypes)
            if shared_gate is not None:
                consts.update(num_shared_experts=shared_experts, num_weight_experts=num_experts + shared_experts)
                return definition_for(TEMPLATES["renorm_shared_gate"],
                                      f"moe_{SHORT_DTYPES[dtype]}_{routing}_topk{top_k}_{shape}_shared{shared_experts}"
                                      f"_sigmoid_gate{logits}",
                                      consts, dtype, {"RENORMALIZE": renormalize},
                                      input_dtypes={"routing_logits": logits_dtype,
                                                    "shared_gate_logits": schema_dtype(shared_gate.dtype)})
            if llama4:
                return definition_for(TEMPLATES[routing], f"moe_{SHORT_DTYPES[dtype]}_{routing}_topk{top_k}_{shape}{logits}",
                                      consts, dtype, {"WEIGHT_ON_INPUT": True}, input_dtypes={"routing_logits": logits_dtype})
            return definition_for(TEMPLATES[routing], f"moe_{SHORT_DTYPES[dtype]}_{routing}_topk{top_k}_{shape}{logits}",
                                  consts, dtype, input_dtypes={"routing_logits": logits_dtype})
        return _deepseek_definition(dtype, logits_dtype, schema_dtype(bias_dtype), top_k, shape, consts, deepseek,
                                    shared_experts, None if local is None else local.count)

    key = ("moe", routing, num_experts, top_k, hidden, intermediate_size, hidden_states.dtype, routing_logits.dtype,
           deepseek, bias_dtype, shared_experts, None if local is None else local.count, swiglu_oai, llama4, mxfp4,
           None if shared_gate is None else shared_gate.dtype)
    definition = cached_definition(key, build)
    scalars = {} if local is None else {"local_expert_offset": local.offset}
    return KernelCall(definition, {"seq_len": rows(hidden_states, hidden)}, scalars=scalars)


def _deepseek_definition(dtype: DType, logits_dtype: DType, bias_dtype: DType, top_k: int, shape: str,
                         consts: dict[str, int], routing: DeepSeekRouting, shared_experts: int,
                         local_experts: Optional[int]) -> Definition:
    """``moe_{dtype}_ds_routing_topk{K}_ng{G}_kg{KG}_{shape}`` (flashinfer-trace's naming), another
    scaling factor than DeepSeek-V3's and a fused shared expert (``_shared1``) said in the name.
    Under expert parallelism ``e`` counts the rank's experts, as flashinfer-trace's EP Definitions
    do, and ``_ep{N}`` says of how many (so that no unsplit layer of as many experts has the name).
    Renormalized weights only (the template's; a layer without is reported by the engine's hook)."""
    if not routing.renormalize:
        raise NotImplementedError("MoE layer without a Definition: DeepSeek routing without renormalized weights")
    extra = "" if routing.routed_scaling_factor == 2.5 else f"_rs{routing.routed_scaling_factor:g}"
    if shared_experts:
        consts = {**consts, "num_shared_experts": shared_experts,
                  "num_weight_experts": consts["num_experts"] + shared_experts}
        extra += f"_shared{shared_experts}"
    template = "ds_routing_shared" if shared_experts else "ds_routing"
    if local_experts is not None:
        consts = {**consts, "num_local_experts": local_experts}
        shape = shape.replace(f"e{consts['num_experts']}_", f"e{local_experts}_", 1)
        extra += f"_ep{consts['num_experts'] // local_experts}"
        template = "ds_routing_ep"
    dtypes = "".join(f"_{what}_{SHORT_DTYPES.get(d, d.value)}" for what, d in (("logits", logits_dtype), ("bias", bias_dtype))
                     if d is not DType.float32)
    return definition_for(
        TEMPLATES[template],
        f"moe_{SHORT_DTYPES[dtype]}_ds_routing_topk{top_k}_ng{routing.n_group}_kg{routing.topk_group}_{shape}{extra}{dtypes}",
        consts, dtype,
        {"N_GROUP": routing.n_group, "TOPK_GROUP": routing.topk_group,
         "ROUTED_SCALING_FACTOR": float(routing.routed_scaling_factor)},
        input_dtypes={"routing_logits": logits_dtype, "routing_bias": bias_dtype},
    )


#: MXFP4 (OCP microscaling): E2M1 weights, one E8M0 scale per block of this many along their input
MXFP4_BLOCK = 32


def mxfp4_problems(hidden: int, intermediate: int, dtype: torch.dtype) -> list[str]:
    """What MXFP4 experts do that the ``moe_mxfp4_*`` Definitions do not compute, in words."""
    return [what for what, applies in {
        f"MXFP4 experts with {schema_dtype(dtype).value} activations": dtype != torch.bfloat16,
        f"MXFP4 experts of sizes {hidden} x {intermediate} (not whole blocks of {MXFP4_BLOCK})":
            hidden % MXFP4_BLOCK != 0 or intermediate % MXFP4_BLOCK != 0,
    }.items() if applies]


def problems(*, router: Optional[str] = None, scoring: Any = "softmax", grouped_topk: bool = False,
             custom_routing: bool = False, correction_bias: bool = False, fused_shared_experts: bool = False,
             fused_shared_recorded: bool = False,
             routed_scaling: Optional[float] = None, quantization: Optional[str] = None, activation: Optional[str] = None,
             gated: bool = True, expert_bias: bool = False, router_weight_on_input: bool = False,
             expert_parallel: bool = False, expert_parallel_recorded: bool = False,
             deepseek_routing: bool = False, quantization_recorded: bool = False,
             swiglu_oai_recorded: bool = False, llama4_routing_recorded: bool = False,
             mxfp4_recorded: bool = False) -> list[str]:
    """What a MoE layer does that no MoE Definition computes, in words; each engine passes what
    its layer says (an argument it does not pass is a feature its layers do not have):
    ``router``: the class of a router that is not a softmax top-k one; ``quantization``: the
    experts' method class; ``activation`` and ``gated``: the experts' activation;
    ``deepseek_routing``: the engine records this layer's DeepSeek routing (sigmoid scores, grouped
    top-k with the correction bias, routed scaling), which is then no problem; likewise
    ``fused_shared_recorded`` for its fused shared experts, ``expert_parallel_recorded`` for its
    rank's share of the experts (the engine knows which, beside DeepSeek's routing) and
    ``quantization_recorded`` for FP8 block-scale experts (:mod:`.fp8_block`) and
    ``swiglu_oai_recorded`` for gpt-oss's biased ``swigluoai`` experts (:class:`SwigluOAI`), which
    only unquantized experts beside a softmax router are recorded as; ``llama4_routing_recorded``
    for Llama-4's custom routing function with the weight on the input, recorded for unquantized
    SwiGLU experts without bias or expert parallelism; ``mxfp4_recorded`` for gpt-oss's experts
    with MXFP4 weights (``quantization`` the engine's method for them), recorded as its
    ``swigluoai`` ones are."""
    swiglu_oai_recorded = swiglu_oai_recorded and not (
        deepseek_routing or quantization_recorded or expert_parallel or router is not None or fused_shared_experts
        or (quantization not in (None, "UnquantizedFusedMoEMethod") and not mxfp4_recorded))
    mxfp4 = mxfp4_recorded and swiglu_oai_recorded
    # a custom routing function replaces the scoring (vLLM's GPU router for it has none; its CPU one
    # would score sqrtsoftplus before it)
    llama4 = llama4_routing_recorded and custom_routing and router_weight_on_input and scoring in (None, "softmax") and not (
        deepseek_routing or swiglu_oai_recorded or expert_parallel or grouped_topk or correction_bias
        or fused_shared_experts or expert_bias or routed_scaling not in (None, 1.0)
        or quantization not in (None, "UnquantizedFusedMoEMethod"))
    deepseek = deepseek_routing and scoring == "sigmoid" and grouped_topk and correction_bias
    features = {
        f"router {router}": router is not None,
        f"scoring {scoring}": scoring != "softmax" and not deepseek and not llama4,
        "grouped top-k": grouped_topk and not deepseek,
        "custom routing": custom_routing and not llama4,
        "correction bias": correction_bias and not deepseek,
        "fused shared experts": fused_shared_experts and not fused_shared_recorded,
        "routed scaling": routed_scaling not in (None, 1.0) and not deepseek,
        f"quantization {quantization}": quantization not in (None, "UnquantizedFusedMoEMethod") and not quantization_recorded
        and not mxfp4,
        f"activation {activation}": activation is not None and (str(activation) != "silu" or not gated)
        and not swiglu_oai_recorded,
        "expert bias": expert_bias and not swiglu_oai_recorded,
        "router weight on input": router_weight_on_input and not llama4,
        "expert parallelism": expert_parallel and not (expert_parallel_recorded and deepseek),
    }
    return [what for what, applies in features.items() if applies]


def routing_function_name(function: Any) -> Optional[str]:
    """A router's custom routing function as ``module:qualname`` (how an engine's Llama-4 one is
    known, and any other is listed), or None where it has none."""
    if function is None:
        return None
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', type(function).__name__)}"


def layer_problem(layer: Any, found: list[str]) -> Optional[str]:
    """``run.not_covered``'s entry for a MoE layer with the ``found`` :func:`problems`, or None."""
    return f"{type(layer).__name__} with {', '.join(found)} (no MoE Definition computes it)" if found else None


def layer_calls(hidden_states: torch.Tensor, router_logits: torch.Tensor, found: list[str], *, num_experts: int,
                top_k: int, intermediate_size: int, renormalize: bool, deepseek: Optional[DeepSeekRouting] = None,
                routing_bias: Optional[torch.Tensor] = None, shared_experts: int = 0,
                local: Optional[LocalExperts] = None, fp8_block_scale: bool = False,
                power_of_two_scales: bool = False, swiglu_oai: Optional[SwigluOAI] = None, llama4: bool = False,
                mxfp4: bool = False, shared_gate: Optional[torch.Tensor] = None) -> list:
    """A MoE layer (routing + SwiGLU experts) as one fused call, or with FP8 block-scale experts
    (``fp8_block_scale``) as its input's quantization (its scales rounded up to powers of two where
    ``power_of_two_scales``) and the MoE (:mod:`.fp8_block`), or with MXFP4 experts (``mxfp4``);
    raises where it has ``found``
    :func:`problems` (so the hook error says which). ``shared_gate``: :func:`call`'s."""
    if fp8_block_scale and shared_gate is not None:
        found = found + ["FP8 block-scale experts with a shared expert fused in, weighted by a sigmoid gate"]
    if fp8_block_scale:
        found = found + fp8_block.problems(hidden_states.shape[-1], intermediate_size, hidden_states.dtype,
                                           deepseek=deepseek is not None, renormalize=renormalize,
                                           shared_experts=shared_experts, expert_parallel=local is not None)
    if found:
        raise NotImplementedError(f"MoE layer without a Definition: {', '.join(found)}")
    if fp8_block_scale:
        return fp8_block.calls(hidden_states, router_logits, num_experts=num_experts, top_k=top_k,
                               intermediate_size=intermediate_size,
                               n_group=None if deepseek is None else deepseek.n_group,
                               topk_group=None if deepseek is None else deepseek.topk_group, routing_bias=routing_bias,
                               routed_scaling_factor=1.0 if deepseek is None else deepseek.routed_scaling_factor,
                               shared_experts=shared_experts, local_offset=0 if local is None else local.offset,
                               local_count=None if local is None else local.count,
                               power_of_two_scales=power_of_two_scales)
    return [call(hidden_states, router_logits, num_experts=num_experts, top_k=top_k,
                 intermediate_size=intermediate_size, renormalize=renormalize, deepseek=deepseek,
                 routing_bias=routing_bias, shared_experts=shared_experts, local=local, swiglu_oai=swiglu_oai,
                 llama4=llama4, mxfp4=mxfp4, shared_gate=shared_gate)]


CONSTANTS = ("top_k", "RENORMALIZE")
SWIGLUOAI_CONSTANTS = ("top_k", "RENORMALIZE", "ALPHA", "LIMIT")
LLAMA4_CONSTANTS = ("top_k", "WEIGHT_ON_INPUT")
DEEPSEEK_CONSTANTS = ("top_k", "N_GROUP", "TOPK_GROUP", "RENORMALIZE", "ROUTED_SCALING_FACTOR")


def _flops(definition: Definition, axes: Mapping[str, int]) -> Optional[float]:
    """Each token's top-k experts and its fused shared ones: a gate/up GEMM (2I x H) and a down GEMM
    (H x I) each. Unknown where the Definition holds a part of the experts (expert parallelism: how
    many of a token's picks are local depends on the routing) or says no top-k (flashinfer-trace's
    FP8 DeepSeek Definitions say it as the reference's ``TOP_K``)."""
    top_k = axes.get("top_k") or _reference_top_k(definition)
    split = axes.get("num_local_experts", axes.get("num_experts")) != axes.get("num_experts", axes.get("num_local_experts"))
    if top_k is None or split:
        return None
    experts = top_k + axes.get("num_shared_experts", 0)
    return 2.0 * axes["seq_len"] * experts * 3 * axes["hidden_size"] * axes["intermediate_size"]


def _reference_top_k(definition: Definition) -> Optional[int]:
    literal = reference_constant(definition.reference, "TOP_K")
    return int(literal) if literal is not None and literal.isdigit() else None


#: the compiled module that registers ``torch.ops._moe_C``: its name in vLLM's CPU builds, and in its
#: CUDA builds since they moved to the stable ABI (0.2x)
_VLLM_MOE_OPS = ("vllm._moe_C", "vllm._moe_C_stable_libtorch")
#: SGLang's compiled kernels (its routers' and the experts' block alignment)
_SGLANG_OPS = "sgl_kernel"
#: Triton's MoE library (``triton_kernels``), which both engines run gpt-oss's experts with on Hopper;
#: vLLM ships its own copy where none is installed
_TRITON_KERNELS = "triton_kernels"
_VLLM_TRITON_KERNELS = ("triton_kernels", "vllm.third_party.triton_kernels")
#: the word in the names of its expert GEMMs (``_matmul_ogs_NNT_bf16xbf16xmxfp4_...``)
_MATMUL_OGS = "_matmul_ogs_"
_SGLANG_EXPERTS = {"sglang_fused_experts.py": "sglang_fused_experts.py", "expert_layout.py": "expert_layout.py"}
_VLLM_FP8_EXPERTS = {"vllm_fp8_experts.py": "vllm_fp8_experts.py", "expert_layout.py": "expert_layout.py"}


def _in_place(definition: Definition) -> dict[str, str]:
    """SGLang's Triton experts write the layer's output over its input."""
    return {"hidden_states": "output"}


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """The engines' fused MoE (their router kernel, then their Triton experts), for the Definitions
    a baseline computes (softmax top-k, or DeepSeek's routing), where the engine has its MoE
    kernels: vLLM's never with a fused shared expert (vLLM never fuses it, gated or not), SGLang's
    everywhere.
    SGLang's unquantized experts work in place on the layer input."""
    shared = "num_shared_experts" in definition.const_axes
    natives = []
    if fitted == "torch_moe_swigluoai.py":
        # vLLM's swigluoai kernel has gpt-oss's alpha and limit built in
        gpt_oss = all(reference_constant(definition.reference, name) == value for name, value in (("ALPHA", "1.702"),
                                                                                                  ("LIMIT", "7.0")))
        natives = [Native("vllm", "vllm_moe_swigluoai.py", CONSTANTS, requires=_VLLM_MOE_OPS)] if gpt_oss else []
        natives += [Native("sglang", "sglang_moe_swigluoai.py", SWIGLUOAI_CONSTANTS, siblings=_SGLANG_EXPERTS,
                          requires=_SGLANG_OPS, overwrites=_in_place),
                    Native("sglang", "sglang_moe_swigluoai_triton_kernels.py", SWIGLUOAI_CONSTANTS,
                           siblings=_SGLANG_EXPERTS, requires=_TRITON_KERNELS, label="sglang_triton_kernels")]
    elif fitted == "torch_moe_mxfp4_swigluoai.py":
        # both engines run gpt-oss's MXFP4 experts on Hopper through Triton's ``triton_kernels``, whose
        # SwiGLU has gpt-oss's alpha and limit as their defaults
        natives = [Native("vllm", "vllm_moe_mxfp4.py", CONSTANTS, requires=_VLLM_TRITON_KERNELS,
                          label="vllm_triton_kernels"),
                   Native("sglang", "sglang_moe_mxfp4.py", SWIGLUOAI_CONSTANTS, siblings=_SGLANG_EXPERTS,
                          requires=_TRITON_KERNELS, label="sglang_triton_kernels")]
    elif fitted == "torch_moe_llama4.py":
        natives = [Native("vllm", "vllm_moe_llama4.py", LLAMA4_CONSTANTS, requires=_VLLM_MOE_OPS),
                   Native("sglang", "sglang_moe_llama4.py", LLAMA4_CONSTANTS, siblings=_SGLANG_EXPERTS,
                          requires=_SGLANG_OPS, overwrites=_in_place)]
    elif fitted == "torch_moe_shared_gate.py":  # vLLM never fuses a shared expert
        natives = [Native("sglang", "sglang_moe_shared_gate.py", CONSTANTS, siblings=_SGLANG_EXPERTS,
                          requires=_SGLANG_OPS, overwrites=_in_place)]
    elif fitted == "torch_moe.py":
        natives = [Native("vllm", "vllm_moe.py", CONSTANTS, requires=_VLLM_MOE_OPS),
                   Native("sglang", "sglang_moe.py", CONSTANTS, siblings=_SGLANG_EXPERTS, requires=_SGLANG_OPS,
                          overwrites=_in_place)]
    elif fitted == "torch_moe_ds.py":
        natives = [] if shared else [Native("vllm", "vllm_moe_ds.py", DEEPSEEK_CONSTANTS,
                                            siblings={"expert_layout.py": "expert_layout.py"}, requires=_VLLM_MOE_OPS)]
        natives.append(Native("sglang", "sglang_moe_ds.py", DEEPSEEK_CONSTANTS, siblings=_SGLANG_EXPERTS,
                              requires=_SGLANG_OPS, overwrites=_in_place))
    elif fitted == "torch_moe_fp8_ds.py":
        constants = ("TOP_K", "N_GROUP", "TOPK_GROUP")
        natives = [] if shared else [Native("vllm", "vllm_moe_fp8_ds.py", constants, siblings=_VLLM_FP8_EXPERTS,
                                            requires=_VLLM_MOE_OPS)]
        natives.append(Native("sglang", "sglang_moe_fp8_ds.py", constants, siblings=_SGLANG_EXPERTS,
                              requires=_SGLANG_OPS))
    elif fitted == "torch_moe_fp8_renorm.py":
        natives = [Native("vllm", "vllm_moe_fp8_renorm.py", ("TOP_K",), siblings=_VLLM_FP8_EXPERTS,
                          requires=_VLLM_MOE_OPS),
                   Native("sglang", "sglang_moe_fp8_renorm.py", ("TOP_K",), siblings=_SGLANG_EXPERTS,
                          requires=_SGLANG_OPS)]
    return natives


#: the engines' Triton fused-experts kernel (both name it so), which their natives run
_TRITON_EXPERTS = "fused_moe_kernel"


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """The engine's fused MoE where it ran its Triton experts: on Triton's ``triton_kernels`` where the
    accounting names its ``matmul_ogs`` GEMMs (gpt-oss's on Hopper); else vLLM's unless its kernel
    accounting says other kernels ran (MXFP4 experts only where it names them); SGLang's (whose MoE
    runners differ by card and checkpoint) only where the accounting names its Triton experts."""
    libraries = {"vLLM": "vllm", "SGLang": "sglang"}
    if run.framework not in libraries:
        return None
    if any(_MATMUL_OGS in kernel for kernel in run.kernels):
        return EngineKernel(f"{libraries[run.framework]}_triton_kernels",
                            f"{run.framework}'s MoE on Triton's triton_kernels (its routing + matmul_ogs experts)")
    launched = run.launched(_TRITON_EXPERTS)
    if launched is False:
        return EngineKernel(None, f"{run.framework}'s MoE kernels {', '.join(k[:60] for k in run.kernels)}, which "
                                  "the replay has no solution of (its natives are the engines' Triton experts)")
    spec = definition.inputs.get("gemm1_weights")
    if launched is None and (run.framework == "SGLang" or (spec is not None and spec.dtype is DType.float4_e2m1)):
        return EngineKernel(None, f"{run.framework}'s MoE runner, which the record does not name (its kernel "
                                  "accounting did not run)")
    return EngineKernel(libraries[run.framework],
                        f"{run.framework}'s fused MoE (its router kernel + its Triton fused experts)")


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("moe",),
    templates=tuple(TEMPLATES.values()) + tuple(fp8_block.TEMPLATES.values()),
    baselines=(Baseline("torch_moe.py", CONSTANTS, compiled=False),
               Baseline("torch_moe_shared_gate.py", CONSTANTS, compiled=False),
               Baseline("torch_moe_swigluoai.py", SWIGLUOAI_CONSTANTS, compiled=False),
               Baseline("torch_moe_mxfp4_swigluoai.py", SWIGLUOAI_CONSTANTS, compiled=False),
               Baseline("torch_moe_llama4.py", LLAMA4_CONSTANTS, compiled=False),
               Baseline("torch_moe_ds.py", DEEPSEEK_CONSTANTS, compiled=False),
               Baseline("torch_moe_fp8_ds.py", ("TOP_K", "N_GROUP", "TOPK_GROUP"), compiled=False),
               Baseline("torch_moe_fp8_renorm.py", ("TOP_K",), compiled=False)),
    natives=_natives,
    engine_kernel=_engine_kernel,
    flops=_flops,
    # every expert's output rounds at its own magnitude (routed scaling makes it larger) before the
    # top-k are summed: one rounding step of the largest term, not of the sum (DeepSeek-V3's bf16
    # baseline misses by 0.031, one step at 4-8, where outputs reach 6 and sum to 0.04)
    atol_of_largest=True,
    # the engines' FP8 experts quantize the SwiGLU output again (per token group) for gemm2
    rounds_through=fp8_block.rounds_through,
    # SGLang's routing kernel (softmax or sigmoid top-k), ``_router_triton_kernel``
    # and Triton's MoE kernels (``triton_kernels``, SGLang's and vLLM's gpt-oss path on Hopper): the
    # expert GEMMs ``_matmul_ogs_*`` (not a GEMM's) and their routing ``_bitmatrix_*_stage1`` (not
    # attention's, by its longer word)
    kernel_words=("moe", "expert", "experts", "topk", "topk_softmax", "grouped_topk", "align_block", "router",
                  "matmul_ogs", "bitmatrix"),
    # the top-k outputs' sum, compiled by Inductor (SGLang up to 32 tokens) or Triton's MoE's own
    # (``_reduce``, ``_reduce_grouped``: ``triton_kernels``' combine); vLLM's MoE op copying its output
    # into the layer's output buffer
    tail_words=("sum", "memcpy", "_reduce"),
    # the routed experts' activation between their two GEMMs (``act_and_mul_kernel``), and an FP8
    # MoE's quantization of its output for the second GEMM
    launches=("silu_and_mul", "fp8_linear"),
)
