"""A fused MoE layer: softmax top-k routing (weights renormalized or not) and SwiGLU experts, as
one call. Op type ``moe``; hooked where each engine's MoE layer runs (vLLM's ``MoERunner``,
SGLang's ``TopK`` then ``FusedMoE``). What a layer does beyond that is said by
:func:`problems`, which both engines fill from their layers' attributes."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import SHORT_DTYPES, KernelCall, cached_definition, rows
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "moe"

#: routing -> the shipped Definition whose reference routes that way (instantiated per shape)
TEMPLATES = {
    "renorm": "moe_bf16_renorm_topk2_e8_h4096_i14336",  # softmax, top-k, weights renormalized
    "softmax": "moe_bf16_softmax_topk8_e64_h2048_i1024",  # softmax, top-k, weights as they are
}


def call(hidden_states: torch.Tensor, routing_logits: torch.Tensor, num_experts: int, top_k: int,
         intermediate_size: int, renormalize: bool) -> KernelCall:
    """A fused MoE layer (routing + SwiGLU experts) with a softmax top-k router."""
    hidden = hidden_states.shape[-1]
    routing = "renorm" if renormalize else "softmax"

    def build() -> Definition:
        dtype = schema_dtype(hidden_states.dtype)
        logits_dtype = schema_dtype(routing_logits.dtype)
        if dtype not in SHORT_DTYPES:
            raise NotImplementedError(f"MoE in {dtype.value}: only unquantized bf16/fp16/fp32 MoE has a Definition")
        logits = "" if logits_dtype is dtype else f"_logits_{SHORT_DTYPES.get(logits_dtype, logits_dtype.value)}"
        return definition_for(
            TEMPLATES[routing],
            f"moe_{SHORT_DTYPES[dtype]}_{routing}_topk{top_k}_e{num_experts}_h{hidden}_i{intermediate_size}{logits}",
            {"num_experts": num_experts, "top_k": top_k, "hidden_size": hidden, "intermediate_size": intermediate_size,
             "gemm1_out_size": 2 * intermediate_size},
            dtype,
            input_dtypes={"routing_logits": logits_dtype},
        )

    key = ("moe", routing, num_experts, top_k, hidden, intermediate_size, hidden_states.dtype, routing_logits.dtype)
    definition = cached_definition(key, build)
    return KernelCall(definition, {"seq_len": rows(hidden_states, hidden)})


def problems(*, router: Optional[str] = None, scoring: Any = "softmax", grouped_topk: bool = False,
             custom_routing: bool = False, correction_bias: bool = False, fused_shared_experts: bool = False,
             routed_scaling: Optional[float] = None, quantization: Optional[str] = None, activation: Optional[str] = None,
             gated: bool = True, expert_bias: bool = False, router_weight_on_input: bool = False,
             expert_parallel: bool = False) -> list[str]:
    """What a MoE layer does that no MoE Definition computes, in words; each engine passes what
    its layer says (an argument it does not pass is a feature its layers do not have):
    ``router``: the class of a router that is not a softmax top-k one; ``quantization``: the
    experts' method class; ``activation`` and ``gated``: the experts' activation."""
    features = {
        f"router {router}": router is not None,
        f"scoring {scoring}": scoring != "softmax",
        "grouped top-k": grouped_topk,
        "custom routing": custom_routing,
        "correction bias": correction_bias,
        "fused shared experts": fused_shared_experts,
        "routed scaling": routed_scaling not in (None, 1.0),
        f"quantization {quantization}": quantization not in (None, "UnquantizedFusedMoEMethod"),
        f"activation {activation}": activation is not None and (str(activation) != "silu" or not gated),
        "expert bias": expert_bias,
        "router weight on input": router_weight_on_input,
        "expert parallelism": expert_parallel,
    }
    return [what for what, applies in features.items() if applies]


def layer_problem(layer: Any, found: list[str]) -> Optional[str]:
    """``run.not_covered``'s entry for a MoE layer with the ``found`` :func:`problems`, or None."""
    return f"{type(layer).__name__} with {', '.join(found)} (no MoE Definition computes it)" if found else None


def layer_calls(hidden_states: torch.Tensor, router_logits: torch.Tensor, found: list[str], *, num_experts: int,
                top_k: int, intermediate_size: int, renormalize: bool) -> list:
    """A MoE layer (routing + SwiGLU experts) as one fused call; raises where it has ``found``
    :func:`problems` (so the hook error says which)."""
    if found:
        raise NotImplementedError(f"MoE layer without a Definition: {', '.join(found)}")
    return [call(hidden_states, router_logits, num_experts=num_experts, top_k=top_k,
                 intermediate_size=intermediate_size, renormalize=renormalize)]


CONSTANTS = ("top_k", "RENORMALIZE")


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """vLLM's fused MoE (fused_topk + fused_experts), for the Definitions the baseline computes
    (softmax top-k routing), where vLLM has its MoE kernels."""
    return [] if fitted is None else [Native("vllm", "vllm_moe.py", CONSTANTS, requires="vllm._moe_C")]


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    if run.framework == "vLLM":
        return EngineKernel("vllm", "vLLM's fused MoE (fused_topk + fused_experts)")
    return None


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("moe",),
    templates=tuple(TEMPLATES.values()),
    baselines=(Baseline("torch_moe.py", CONSTANTS, compiled=False),),
    natives=_natives,
    engine_kernel=_engine_kernel,
    kernel_words=("moe", "expert", "experts", "topk", "topk_softmax", "grouped_topk", "align_block"),
)
