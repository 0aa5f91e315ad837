"""SGLang's MoE layers as the MoE family's calls: ``TopK`` routes (it holds the router's
configuration: softmax top-k, or DeepSeek's grouped sigmoid routing) and ``FusedMoE`` right after
it runs the experts; the two are one MoE call. DeepSeek's router GEMM (``MoEGate``) is a GEMM call."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.kernel_call import rows
from fi_profile.capture.layers import KnownAttributes, require, seen, seen_weights
from fi_profile.families import gemm, moe, shared_expert_gate
from fi_profile.hooks.sglang import fp8_linear as sglang_fp8
from fi_profile.hooks.sglang.attention import STEP


def _fused_shared_experts(config: Any) -> int:
    """Shared experts SGLang fused into the routed ones (extra top-k slots): on the config itself
    (0.5.16) or in its shared-experts layout (0.5.23)."""
    shared = getattr(config, "shared_experts", None)
    return int(getattr(config, "num_fused_shared_experts", 0) or getattr(shared, "num_fused_shared_experts", 0) or 0)


def _shared_slots(config: Any) -> int:
    """The top-k slots SGLang gives the fused shared experts: 0.5.23 says so itself (none where its
    waterfill balancing routes them), 0.5.16 gives one per fused shared expert."""
    slots = getattr(config, "num_shared_topk_slots", None)
    return int(slots) if slots is not None else _fused_shared_experts(config)


def deepseek_routing(config: Any) -> Optional[moe.DeepSeekRouting]:
    """The router's DeepSeek routing (sigmoid scores, grouped top-k with the correction bias, the
    routed scaling factor, applied by SGLang to the weights or to the routed output), or None."""
    if not (getattr(config, "scoring_func", "softmax") == "sigmoid" and getattr(config, "use_grouped_topk", False)
            and getattr(config, "correction_bias", None) is not None):
        return None
    return moe.DeepSeekRouting(n_group=int(config.num_expert_group), topk_group=int(config.topk_group),
                               renormalize=bool(config.renormalize),
                               routed_scaling_factor=float(getattr(config, "routed_scaling_factor", None) or 1.0))


#: the custom routing function of SGLang's Llama-4 (``Llama4MoE.custom_routing_function``: the top-k
#: logits, each through a sigmoid, as vLLM's), by where it is defined: any other is listed by name
LLAMA4_ROUTING = "sglang.srt.models.llama4:Llama4MoE.custom_routing_function"


def llama4_routing(config: Any) -> bool:
    """Whether a ``TopK`` router routes as Llama-4 does (its custom function, no renormalization);
    that the experts take the weight on their input is their runner configuration's to say."""
    return (moe.routing_function_name(getattr(config, "custom_routing_function", None)) == LLAMA4_ROUTING
            and not bool(getattr(config, "renormalize", False)))


def routing_problems(config: Any, runner: Any = None) -> dict[str, Any]:
    """What a ``TopK`` router (its ``topk_config``) does, as :func:`fi_profile.families.moe.problems`
    takes it; ``runner``: the experts' runner configuration after it, which says whether they take
    the router's weight on their input (judged there; a router alone is judged as if they do,
    where it routes as Llama-4's)."""
    return dict(
        scoring=getattr(config, "scoring_func", "softmax"),
        grouped_topk=bool(getattr(config, "use_grouped_topk", False)),
        custom_routing=getattr(config, "custom_routing_function", None) is not None,
        llama4_routing_recorded=llama4_routing(config),
        router_weight_on_input=bool(getattr(runner, "apply_router_weight_on_input", False)) if runner is not None
        else llama4_routing(config),
        correction_bias=getattr(config, "correction_bias", None) is not None,
        fused_shared_experts=bool(_fused_shared_experts(config)),
        # one shared expert fused beside DeepSeek's routing, in its own top-k slot at weight 1, has
        # a Definition (``_shared1``); balanced by waterfill or otherwise scaled it is another computation
        fused_shared_recorded=(_fused_shared_experts(config) == 1 == _shared_slots(config)
                               and getattr(config, "fused_shared_experts_scaling_factor", None) in (None, 1.0)
                               and deepseek_routing(config) is not None),
        routed_scaling=getattr(config, "routed_scaling_factor", None) or getattr(runner, "routed_scaling_factor", None),
        deepseek_routing=deepseek_routing(config) is not None,
    )


def _routing_found(config: Any, runner: Any = None, **experts: Any) -> list[str]:
    found = moe.problems(**routing_problems(config, runner), **experts)
    if "custom routing" in found:
        found[found.index("custom routing")] = \
            f"custom routing {moe.routing_function_name(getattr(config, 'custom_routing_function', None))}"
    deepseek = deepseek_routing(config)
    if deepseek is not None and not deepseek.renormalize:
        found.append("DeepSeek routing without renormalized weights")
    return found


def routing_problem(router: Any) -> Optional[str]:
    return moe.layer_problem(router, _routing_found(router.topk_config))


def gate_problem(gate: Any) -> Optional[str]:
    """Why a DeepSeek router (``MoEGate``) is not the plain GEMM recorded for it, or None."""
    name = type(gate).__name__
    if name != "MoEGate":
        return f"{name} (a MoEGate variant no Definition computes)"
    problems = [what for what, applies in {
        "DeepSeek-V4 routing": bool(getattr(gate, "is_deepseek_v4", False)),
        "a vision correction bias": getattr(gate, "e_score_correction_bias_vl", None) is not None,
        # SGLang's AMX path packs the weight for its own kernel: its shape is no longer [experts, hidden]
        f"weights packed by {type(getattr(gate, 'quant_method', None)).__name__}":
            getattr(gate, "quant_method", None) is not None,
    }.items() if applies]
    return f"{name} with {', '.join(problems)} (no Definition computes it)" if problems else None


def gate_calls(self: Any, hidden_states: torch.Tensor) -> list:
    """DeepSeek's router (``MoEGate``: a GEMM of its own, float32 logits on CUDA, no linear layer):
    recorded by the ``TopK`` call right after it, which sees the logits it made."""
    seen(self)
    require(gate_problem(self))
    STEP.context["moe_gate"] = (self, hidden_states)
    return []


def _gate_gemm(router_logits: torch.Tensor) -> list:
    """The router GEMM whose logits ``TopK`` was handed, where a ``MoEGate`` made them."""
    gate = STEP.context.pop("moe_gate", None)
    if gate is None:
        return []
    layer, hidden_states = gate
    n, k = (int(size) for size in layer.weight.shape)  # [experts, hidden]: a plain parameter, never repacked
    if router_logits.shape[-1] != n or hidden_states.shape[-1] != k:
        raise RuntimeError(f"MoEGate [{n}, {k}] ran, then TopK got logits {tuple(router_logits.shape)}: not its own")
    operands = torch.float32 if layer.weight.dtype == torch.float32 else hidden_states.dtype
    return [gemm.sized_call(rows(hidden_states, k), n, k, operands, out_dtype=router_logits.dtype)]


def routing_calls(self: Any, router_logits: torch.Tensor) -> list:
    """``TopK``: the router GEMM of a ``MoEGate`` just before it, where one ran; the routing itself
    is part of the MoE call that the experts layer right after it records (one fused MoE call, as
    for vLLM)."""
    seen(self)
    STEP.context["moe_routing"] = (router_logits, self.topk_config)
    return _gate_gemm(router_logits)


def _shared_gate_scale(block: Any) -> float:
    """The factor SGLang puts on the fused shared expert's gate weight (1/EP size under expert
    parallelism with one global shared slot; 1 else), read from the block where it says."""
    scale = getattr(block, "_shared_expert_scale", None)
    return float(scale()) if callable(scale) else 1.0


def shared_gate_problem(block: Any) -> Optional[str]:
    """Why a Qwen2-MoE block's fused shared expert is not what the ``_shared1_sigmoid_gate``
    Definitions compute (the sigmoid of one gate logit per token weighing the shared expert's slot),
    or None."""
    gate = getattr(block, "shared_expert_gate", None)
    found = [what for what, applies in {
        f"a shared-expert gate {type(gate).__name__}": gate is not None and not isinstance(gate, torch.nn.Linear),
        "a biased shared-expert gate": getattr(gate, "bias", None) is not None,
        f"the shared expert's gate weight scaled by {_shared_gate_scale(block):g} (expert parallelism)":
            _shared_gate_scale(block) != 1.0,
        f"{getattr(block, 'num_fused_shared_experts', '?')} fused shared experts":
            getattr(block, "num_fused_shared_experts", 1) != 1,
    }.items() if applies]
    return (f"{type(block).__name__} with {', '.join(found)} fused into its MoE (no MoE Definition computes it)"
            if found else None)


def fused_shared_gate_calls(self: Any) -> list:
    """A Qwen2-MoE block (Qwen3-Next's, on CUDA) appending its shared expert to each token's top-k,
    weighted by the sigmoid of its gate's logit (``_append_shared_to_topk_output``: the gate's
    ``nn.Linear``, a GEMM call of its own (:func:`torch_linear_calls`), then the sigmoid and the
    append kernel): recorded by the experts' MoE call right after it, which is told of the gate;
    its kernels but the gate's GEMM are that call's."""
    if not getattr(self, "enable_shared_expert_fusion", False) or getattr(self, "shared_expert_gate", None) is None:
        return []
    require(shared_gate_problem(self))
    STEP.context["moe_shared_gate"] = self.shared_expert_gate.weight
    return []


def torch_linear_calls(self: Any, input: torch.Tensor) -> list:  # noqa: A002 - nn.Linear.forward's name
    """A torch ``nn.Linear`` SGLang calls in a model: the shared-expert gate of a Qwen2-MoE block
    that fuses its shared expert into the experts (one output, no bias; its logits are the MoE call's
    input), a GEMM. Any other is one no Definition is known to fit (:func:`one_output_linear_problem`)."""
    require(one_output_linear_problem(self))
    seen(self)
    n, k = int(self.out_features), int(self.in_features)
    return [gemm.sized_call(rows(input, k), n, k, input.dtype)]


def local_experts(layer: Any) -> Optional[moe.LocalExperts]:
    """The rank's routed experts under expert parallelism (SGLang keeps them in one contiguous run,
    its storage rank's), or None without it, or where this SGLang says not which (then listed)."""
    if layer.num_local_experts == layer.num_experts:
        return None
    routed, rank = getattr(layer, "_num_local_routed", None), getattr(layer, "moe_ep_rank", None)
    # the dispatcher maps the rank's run of experts (by its EP rank) to the weights it stores (by its
    # storage rank): elastic EP's joined ranks store another run than they are sent
    if routed is None or rank is None or getattr(layer, "_expert_storage_rank", rank) != rank:
        return None
    return moe.LocalExperts(int(rank) * int(routed), int(routed))


def _expert_parallel_problems(layer: Any) -> list[str]:
    """What SGLang's expert parallelism does here that the EP Definitions do not say: tokens
    dispatched to other ranks (DeepEP, Mooncake and the like), experts not laid out as their ranks'
    contiguous runs."""
    if layer.num_local_experts == layer.num_experts:
        return []
    found = []
    if local_experts(layer) is None:
        found.append("expert parallelism whose local experts this SGLang does not say")
    dispatcher = type(getattr(layer, "dispatcher", None)).__name__
    if dispatcher not in ("StandardDispatcher", "NoneType"):
        found.append(f"tokens dispatched across ranks by {dispatcher}")
    return found


def _deep_gemm_runner(method: Any) -> bool:
    """Whether the experts' method runs them with SGLang's DeepGEMM MoE runner."""
    backend = getattr(getattr(method, "runner", None), "runner_backend", None)
    return bool(backend is not None and backend.is_deep_gemm())


def fp8_block_problem(layer: Any) -> Optional[str]:
    """Why the experts' quantization method is not FP8 block-scale experts in 128 x 128 blocks with
    dynamic per-token-group activations (what the ``moe_fp8_block_scale_*`` Definitions compute:
    SGLang's Triton, DeepGEMM, CUTLASS and FlashInfer TRT-LLM runners all quantize so), or None."""
    method = layer.quant_method
    name = type(method).__name__
    if name != "Fp8MoEMethod" or not getattr(method, "block_quant", False):
        return f"quantization {name}" + ("" if name != "Fp8MoEMethod" else " without weight blocks (no hook yet)")
    config = getattr(method, "quant_config", None)
    found = [what for what, applies in {
        f"{list(getattr(method, 'weight_block_size', None) or [])} blocks (the Definitions dequantize 128 x 128 ones)":
            list(getattr(method, "weight_block_size", None) or []) != [128, 128],
        "MXFP8 weights": bool(getattr(method, "use_mxfp8", False)),
        "FP4 experts": bool(getattr(method, "is_fp4_expert", False)),
        "static activation scales": getattr(config, "activation_scheme", "dynamic") != "dynamic",
        "SGLang's CPU (AMX) kernels": bool(getattr(layer, "use_intel_amx_backend", False)),
        # Blackwell: SGLang's DeepGEMM experts quantize with power-of-two scales, as its FP8 linear
        # layers then do (listed there too)
        "DeepGEMM's power-of-two (UE8M0) scales": _deep_gemm_runner(method) and sglang_fp8.ue8m0_scales(),
    }.items() if applies]
    return f"{name} with {', '.join(found)}" if found else None


#: what the hook knows of a ``FusedMoE`` layer's runner configuration (SGLang 0.5.16 and 0.5.23):
#: gpt-oss's experts set ``gemm1_alpha`` 1.702 and ``gemm1_clamp_limit`` 7.0 there (its SwiGLU
#: variant) and were recorded as a plain SwiGLU MoE; any other field is listed by name
RUNNER_CONFIG = KnownAttributes(
    read=frozenset({"num_experts", "num_local_experts", "hidden_size", "intermediate_size_per_partition", "top_k",
                    "num_fused_shared_experts", "activation", "is_gated", "apply_router_weight_on_input",
                    "routed_scaling_factor"}),
    neutral={"gemm1_alpha": None, "gemm1_beta": None, "gemm1_clamp_limit": None, "swiglu_limit": None,
             "no_combine": False, "no_combine_keep_router_weight": False, "use_tp_all_gather_activation": False,
             "silu_mul_keep_fp32": False},
    inert=frozenset({"layer_id", "params_dtype", "routing_method_type", "runner_backend", "inplace",
                     "gate_up_interleaved", "layer"}),
)


def _biased(layer: Any) -> bool:
    return any(getattr(layer, name, None) is not None for name in ("w13_weight_bias", "w2_weight_bias"))


def swiglu_oai(layer: Any) -> Optional[moe.SwigluOAI]:
    """gpt-oss's experts: SiLU-gated with ``gemm1_alpha`` and ``gemm1_clamp_limit`` set, which
    SGLang's Triton experts compute as ``gate * sigmoid(alpha * gate) * (up + 1)``, clamped, on gate
    and up rows interleaved (0.5.16 has no other layout; 0.5.23 says ``gate_up_interleaved``), with
    both expert biases. None for any other configuration (then listed by its fields)."""
    config = layer.moe_runner_config
    alpha, limit = getattr(config, "gemm1_alpha", None), getattr(config, "gemm1_clamp_limit", None)
    if (config.activation != "silu" or not bool(getattr(config, "is_gated", True)) or alpha is None
            or limit is None or getattr(config, "gemm1_beta", None) is not None
            or getattr(config, "swiglu_limit", None) is not None or not getattr(config, "gate_up_interleaved", True)
            or not all(getattr(layer, name, None) is not None for name in ("w13_weight_bias", "w2_weight_bias"))):
        return None
    return moe.SwigluOAI(alpha=float(alpha), limit=float(limit))


def _experts_problems(layer: Any) -> list[str]:
    """What the experts do beyond SwiGLU experts without bias (or gpt-oss's, :func:`swiglu_oai`):
    their runner configuration's fields off their neutral values or unknown, and expert biases
    (``with_bias``)."""
    config = layer.moe_runner_config
    if swiglu_oai(layer) is not None:  # its alpha and limit are recorded: the rest is judged as for any layer
        return RUNNER_CONFIG.problems(config, "moe_runner_config.", ignore=("gemm1_alpha", "gemm1_clamp_limit"))
    found = RUNNER_CONFIG.problems(config, "moe_runner_config.")
    if _biased(layer):
        found.append("expert bias")
    return found


#: SGLang's method for gpt-oss's MXFP4 experts (weights in the checkpoint's E2M1 blocks of 32 with
#: E8M0 scales; on Hopper it runs them with Triton's ``matmul_ogs``, Marlin or FlashInfer's CUTLASS
#: mixed-input GEMM, on bf16 activations: the accounting's kernel names say which); another MXFP4
#: method is listed by name
MXFP4_METHODS = ("Mxfp4MoEMethod",)


def mxfp4(layer: Any) -> bool:
    """Whether the layer's experts are gpt-oss's MXFP4 ones."""
    return type(layer.quant_method).__name__ in MXFP4_METHODS


def mxfp4_problems(layer: Any) -> list[str]:
    """What SGLang's MXFP4 experts do beyond the ``moe_mxfp4_*`` Definitions: FlashInfer's TRT-LLM
    kernels (Blackwell) quantize the activations to MXFP8 unless told bf16."""
    method = layer.quant_method
    if getattr(method, "_fi_kernel", None) == "trtllm_sm100" and \
            getattr(method, "flashinfer_mxfp4_moe_precision", None) != "bf16":
        return ["MXFP4 experts on MXFP8 activations (FlashInfer's TRT-LLM kernels)"]
    return []


def mxfp4_layer_problem(layer: Any) -> Optional[str]:
    """Why a layer with SGLang's MXFP4 method is not what its hook records (:func:`mxfp4_problems`),
    or None; its routing and experts are judged at its calls, as for any MoE layer."""
    found = mxfp4_problems(layer)
    return f"{type(layer).__name__} with {', '.join(found)}" if found else None


def layer_calls(self: Any, hidden_states: torch.Tensor) -> list:
    """``FusedMoE``: routing (from the ``TopK`` call before it) and SwiGLU experts as one call."""
    seen(self)
    routing = STEP.context.pop("moe_routing", None)
    if routing is None:
        raise RuntimeError("MoE experts called without a TopK call before them: routing unknown")
    router_logits, config = routing
    runner = self.moe_runner_config
    shared = _fused_shared_experts(config)
    routed = int(router_logits.shape[-1])
    # a shared expert the block appended past the router, weighted by its gate (Qwen3-Next on CUDA)
    shared_gate = STEP.context.pop("moe_shared_gate", None)
    if shared_gate is not None and not shared:
        shared = int(shared_gate.shape[0])
    fp8_block = type(self.quant_method).__name__ == "Fp8MoEMethod"
    microscaled = mxfp4(self)
    found = _routing_found(
        config, runner,
        quantization=type(self.quant_method).__name__, quantization_recorded=fp8_block,
        activation=runner.activation, gated=bool(getattr(runner, "is_gated", True)),
        expert_parallel=self.num_local_experts != self.num_experts,
        expert_parallel_recorded=local_experts(self) is not None,
        mxfp4_recorded=microscaled, swiglu_oai_recorded=swiglu_oai(self) is not None,
    ) + _expert_parallel_problems(self) + _experts_problems(self) + (mxfp4_problems(self) if microscaled else [])
    fp8_problem = fp8_block_problem(self) if fp8_block else None
    if fp8_problem is not None:
        found.append(fp8_problem)
    if self.num_experts == routed + shared + 1 and not shared:  # the router does not know of it, nor did the block
        found.append(f"{self.num_experts} experts' weights for {routed} routed: a shared expert SGLang fused into the "
                     "routed ones past the router (Qwen2-MoE's and Qwen3-Next's, its slot weighted by the sigmoid of "
                     "its gate; --engine-arg disable_shared_experts_fusion=true runs it apart, as its own calls)")
    elif self.num_experts != routed + shared:  # redundant experts, or shared slots per rank (expert parallelism)
        found.append(f"{self.num_experts} experts' weights for {routed} routed and {shared} fused shared")
    deepseek = deepseek_routing(config)
    # SGLang's top-k counts the fused shared experts' slots; the Definition's counts the routed ones
    return moe.layer_calls(hidden_states, router_logits, found, num_experts=routed,
                           top_k=config.top_k - _shared_slots(config),
                           intermediate_size=self.intermediate_size_per_partition, renormalize=bool(config.renormalize),
                           deepseek=deepseek, routing_bias=config.correction_bias if deepseek is not None else None,
                           shared_experts=shared, local=local_experts(self), fp8_block_scale=fp8_block,
                           swiglu_oai=None if fp8_block else swiglu_oai(self),
                           llama4=llama4_routing(config) and bool(getattr(runner, "apply_router_weight_on_input", False)),
                           mxfp4=microscaled, shared_gate=shared_gate)


def is_moe_layer(module: Any) -> bool:
    """Whether ``module`` is a MoE layer (:mod:`fi_profile.capture.dummy_routing`)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    return isinstance(module, FusedMoE)


def shared_expert_gate_calls(hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor,
                             final_hidden_states: torch.Tensor) -> list:
    """``fused_gate_sigmoid_mul_add`` (Qwen2-MoE's and Qwen3-Next's shared-expert gate on CUDA, past
    the gate's linear layer, whose weight it takes): the gate, its sigmoid, the product with the
    shared expert's output and the add to the routed output, one kernel."""
    require(None if gate_weight.dim() == 1 and gate_weight.shape[0] == hidden_states.shape[-1] else
            f"fused_gate_sigmoid_mul_add with a gate weight of shape {tuple(gate_weight.shape)} for hidden states of "
            f"{hidden_states.shape[-1]} (one logit per token is what shared_expert_gate_* computes)")
    seen_weights(getattr(gate_weight, "_base", None), gate_weight)  # the gate layer's weight, squeezed
    return [shared_expert_gate.call(hidden_states)]


def one_output_linear_problem(layer: Any) -> Optional[str]:
    """A torch ``nn.Linear`` with one output and no bias is SGLang's shared-expert gate (Qwen2-MoE,
    Qwen3-Next): a GEMM where the block calls it (fusing its shared expert into the experts), or
    the weight the block hands to ``fused_gate_sigmoid_mul_add``; covered where either hook sees it
    (else listed at the end as never reaching a hook). Any other is a GEMM no hook records."""
    if int(getattr(layer, "out_features", 0)) == 1 and getattr(layer, "bias", None) is None:
        return None
    return f"{type(layer).__name__} (a torch nn.Linear no hook records)"
