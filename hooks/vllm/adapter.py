"""vLLM's hook points, found by name (vLLM 0.26 on the GPU hosts, 0.32 in CI; neither pinned).

Each entry says which vLLM method is which op and how its arguments map onto the shared op table
in :mod:`fi_profile.capture.ops`. Methods are patched on the class before the model is built, so
CustomOp's ``forward`` (which dispatches to the method it bound at ``__init__``) is wrapped once at
the top, above every backend-specific path.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional

import numpy as np
import torch

from fi_profile.capture import ops
from fi_profile.capture.ops import KernelCall
from fi_profile.capture.recorder import RECORDER
from fi_profile.capture.step_attention import Batches, StepAttention
from fi_profile.hooks.graph_runs import count_graph_run
from fi_profile.hooks.layer_calls import (
    LayerRule,
    covered,
    embedding,
    gemm_size,
    linear,
    lm_head,
    moe,
    require,
    rmsnorm,
    rmsnorm_problem,
    rope,
    rope_problem,
    seen,
    silu_and_mul,
    silu_and_mul_problem,
)
from fi_profile.hooks.patching import HookPoint
from fi_profile.hooks.traced import TRACES, sizes_of_run
from fi_profile.schema.dtype import schema_dtype

STEP = StepAttention()


def _metadata_builder(self: Any, common_attn_metadata: Any) -> None:
    """Step boundary. Keeps the step's CommonAttentionMetadata: every backend is built from it,
    and it has the layout (query_start_loc, seq_lens, block_table_tensor) even where the
    backend's own metadata holds only planned wrappers (FlashInfer). The step's signature is
    what fixes every var axis of the step: token count, request count, decode/prefill layout."""
    common = common_attn_metadata
    STEP.begin(common=common)
    if common is None or RECORDER.page_size is None:
        return
    shape = ops.step_shape(common.query_start_loc_cpu, int(getattr(common, "num_reqs", len(common.query_start_loc_cpu) - 1)))
    RECORDER.begin_step(shape, tokens=shape[0])


def _host_seq_lens(source: Any) -> Any:
    """The requests' KV lengths without a device sync (one per step would break vLLM's async
    scheduling): the V1 runner's CPU copy, else the V2 runner's host upper bound (exact but for
    async speculative decoding), else the device tensor (copied: a sync)."""
    for name in ("_seq_lens_cpu", "seq_lens_cpu_upper_bound"):
        found = getattr(source, name, None)
        if found is not None:
            return found
    return source.seq_lens


def _layout(source: Any) -> Batches:
    """The step's decode and prefill layouts from its metadata. CPU copies of the query starts and
    sequence lengths where the metadata has them: no device sync."""
    query_start_loc = getattr(source, "query_start_loc_cpu", None)
    if query_start_loc is None:
        query_start_loc = source.query_start_loc
    seq_lens = _host_seq_lens(source)
    block_table = getattr(source, "block_table_tensor", None)
    if block_table is None:
        block_table = source.block_table
    return ops.paged_batches(query_start_loc, seq_lens, block_table, RECORDER.page_size)


def _layout_source(metadata: Any) -> Any:
    common = STEP.context.get("common")
    if common is not None and common.num_actual_tokens == getattr(metadata, "num_actual_tokens", common.num_actual_tokens):
        return common
    return metadata


def attention_problem(layer: Any) -> Optional[str]:
    """Why an attention layer is not a paged GQA call the Definitions compute, or None: only
    vLLM's ``Attention`` itself (MLA, chunked-local, encoder, cross, sink ... are other classes),
    causal decoder self-attention without a window, soft cap or quantized KV cache."""
    name = type(layer).__name__
    if name != "Attention":
        return f"{name} (an attention layer class no Definition computes)"
    attn_type = str(getattr(getattr(layer, "attn_type", "decoder"), "value", getattr(layer, "attn_type", "decoder")))
    features = {
        f"attention type {attn_type}": attn_type.lower() != "decoder",
        f"sliding window {getattr(layer, 'sliding_window', None)}": getattr(layer, "sliding_window", None) is not None,
        "logits soft cap": bool(getattr(getattr(layer, "impl", None), "logits_soft_cap", None)),
        f"KV cache {getattr(layer, 'kv_cache_dtype', 'auto')}": str(getattr(layer, "kv_cache_dtype", "auto")) not in (
            "auto", "bfloat16", "float16"),
    }
    problems = [what for what, applies in features.items() if applies]
    return f"Attention with {', '.join(problems)} (no Definition computes it)" if problems else None


def _attention(self: Any, query: torch.Tensor) -> list[KernelCall]:
    from vllm.forward_context import get_forward_context

    seen(self)
    require(attention_problem(self))
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # micro-batches: the first one's layout
        metadata = metadata[0]
    if isinstance(metadata, dict):
        metadata = metadata.get(self.layer_name)
    if metadata is None:  # profiling / dummy run
        return []
    page_size = RECORDER.page_size
    if page_size is None:
        raise RuntimeError("page size unknown: capture was not started through the worker extension")
    STEP.batches(_layout_source(metadata), _layout)
    dtype = schema_dtype(query.dtype)
    return STEP.calls((self.num_heads, self.num_kv_heads, self.head_size, page_size, RECORDER.num_pages or 0, dtype,
                       float(self.impl.scale)))


def _attention_traced(self: Any, query: torch.Tensor) -> Callable[[], list[KernelCall]]:
    """While torch.compile traces an attention layer: its shape, and how to build its calls in each
    step from the step's metadata (the attention op of a compiled or CUDA-graph forward runs no
    Python hook; the metadata builder runs on the host every step)."""
    seen(self)
    require(attention_problem(self))
    layer = (self.num_heads, self.num_kv_heads, self.head_size, schema_dtype(query.dtype), float(self.impl.scale))
    return functools.partial(_attention_in_graph, layer)


def _attention_in_graph(layer: tuple) -> list[KernelCall]:
    common = STEP.context.get("common")
    if common is None or RECORDER.page_size is None:
        raise RuntimeError("a compiled forward ran without the step's attention metadata")
    STEP.batches(common, _layout)
    heads, kv_heads, head_size, dtype, scale = layer
    return STEP.calls((heads, kv_heads, head_size, RECORDER.page_size, RECORDER.num_pages or 0, dtype, scale))


#: vLLM's cudagraph runtime modes, as the record names them
_RUN_MODES = {"NONE": "compiled", "PIECEWISE": "piecewise_cuda_graph", "FULL": "full_cuda_graph"}


def _compiled_forward(self: Any, *args: Any, **kwargs: Any) -> None:
    """``TorchCompileWithNoGuardsWrapper.__call__``: the compiled model forward is about to run."""
    _graph_run(self, args, kwargs)


def _cuda_graph_call(self: Any, *args: Any, **kwargs: Any) -> None:
    """``CUDAGraphWrapper.__call__`` (and ``BreakableCUDAGraphWrapper``'s): a whole-model graph
    replays without calling the model. A piecewise graph, or a wrapper whose mode is not this
    step's, runs what it wraps: a compiled forward that counts itself."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return
    context = get_forward_context()
    mode = getattr(context.cudagraph_runtime_mode, "name", "NONE")
    own = getattr(getattr(self, "runtime_mode", None), "name", None)  # breakable graphs: none, any mode
    if mode == "NONE" or own == "PIECEWISE" or (own is not None and own != mode):
        return
    runnable = self.runnable
    trace = _traced_forward(self, runnable)
    sizes = sizes_of_run(trace, type(runnable).forward, (runnable, *args), kwargs)
    padded = getattr(getattr(context, "batch_descriptor", None), "num_tokens", None)
    for symbol, (name, _) in trace.symbols.items():  # the wrapped model may name its token inputs otherwise
        if symbol not in sizes and name in _TOKEN_ARGUMENTS and padded is not None:
            sizes[symbol] = int(padded)
    _count_compiled(trace, sizes, mode=_RUN_MODES.get(mode, "full_cuda_graph") if own else "breakable_cuda_graph")


def _traced_forward(wrapper: Any, runnable: Any) -> Any:
    """The trace of the forward a whole-model graph runs: the wrapped module's own, or that of the
    one module inside it whose forward torch.compile traced (the V1 runner wraps ``*ForCausalLM``,
    whose inner ``*Model`` is the compiled one). The module is found once per wrapper."""
    module = wrapper.__dict__.get("_fi_profile_traced")
    if module is None:
        found = [m for m in (runnable.modules() if hasattr(runnable, "modules") else (runnable,)) if _trace_of(m) is not None]
        if len(found) != 1:
            raise RuntimeError(
                f"a whole-model CUDA graph of {type(runnable).__name__} ran, and {len(found)} traced forwards are inside "
                f"it ({', '.join(type(m).__name__ for m in found) or 'none'}): its calls are not in the record")
        module = wrapper.__dict__["_fi_profile_traced"] = found[0]
    trace = _trace_of(module)
    if trace is None:
        raise RuntimeError(f"{type(module).__name__}'s forward is no longer traced: its calls are not in the record")
    return trace


def _trace_of(module: Any) -> Any:
    code = getattr(module, "original_code_object", None)
    return TRACES.get(code()) if callable(code) else None


def _engine_step(self: Any, scheduler_output: Any, dummy_run: bool = False) -> Any:
    """``execute_model``: one engine step. A step that schedules tokens runs the model's forward,
    which must be in the record (:meth:`~fi_profile.capture.recorder.Recorder.engine_step`)."""
    tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
    if not RECORDER.active or dummy_run or tokens == 0:
        return contextlib.nullcontext()
    per_request = list(getattr(scheduler_output, "num_scheduled_tokens", {}).values())
    decoding = sum(1 for n in per_request if n == 1)
    return RECORDER.engine_step(f"a step of {tokens} tokens for {len(per_request)} requests "
                                f"({decoding} decoding, {len(per_request) - decoding} prefilling)")


#: the compiled forward's arguments whose first dimension is the step's (padded) token count
_TOKEN_ARGUMENTS = ("input_ids", "positions", "inputs_embeds")


def _graph_run(model: Any, args: tuple, kwargs: dict) -> None:
    """One run of a compiled forward, with its real arguments (their sizes are the padded ones)."""
    trace = TRACES.get(model.original_code_object())
    if trace is None:
        raise RuntimeError(f"{type(model).__name__}'s compiled forward ran but was not traced in this process "
                           "(loaded from a compile cache?): its calls are not in the record")
    _count_compiled(trace, sizes_of_run(trace, type(model).forward, (model, *args), kwargs))


def _full_graph_replay(self: Any, desc: Any) -> None:
    """The V2 model runner replays a whole-model (FULL) CUDA graph without calling the model: the
    padded token count is the descriptor's."""
    traces = [t for t in TRACES.values() if any(name in _TOKEN_ARGUMENTS for name, _ in t.symbols.values())]
    if len(traces) != 1:
        raise RuntimeError(f"a full CUDA graph replayed, but {len(traces)} traced model forwards could be it")
    trace = traces[0]
    _count_compiled(trace, {s: int(desc.num_tokens) for s, (name, _) in trace.symbols.items() if name in _TOKEN_ARGUMENTS},
                    mode="full_cuda_graph")


def _count_compiled(trace: Any, sizes: dict[str, int], mode: Optional[str] = None) -> None:
    """The traced templates as this step's calls (once per forward context: a full-graph wrapper
    that falls through to the model would count twice)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    context = get_forward_context() if is_forward_context_available() else None
    if context is not None:
        if context.attn_metadata is None or getattr(context, "_fi_profile_counted", False):
            return  # a dummy run, or this forward is counted already
        context._fi_profile_counted = True
        if mode is None:
            mode = _RUN_MODES.get(getattr(context.cudagraph_runtime_mode, "name", "NONE"), "compiled")
    ran_with = next((sizes[s] for s, (name, _) in trace.symbols.items() if name in _TOKEN_ARGUMENTS and s in sizes),
                    RECORDER.step_tokens)
    count_graph_run(trace, sizes, mode or "compiled", ran_with)


#: routers whose selection is softmax -> top-k (-> renormalize), as the MoE Definitions compute it
_SOFTMAX_TOPK_ROUTERS = ("FusedTopKRouter", "CPURouter")


def _moe_unsupported(runner: Any) -> dict[str, bool]:
    """What a MoE layer (``MoERunner``) has that no MoE Definition computes."""
    router, config, experts = runner.router, runner.moe_config, runner.routed_experts
    activation = getattr(getattr(experts, "activation", None), "value", getattr(experts, "activation", "silu"))
    return {
        f"router {type(router).__name__}": type(router).__name__ not in _SOFTMAX_TOPK_ROUTERS,
        f"scoring {getattr(router, 'scoring_func', None)}": getattr(router, "scoring_func", None) != "softmax",
        "grouped top-k": bool(getattr(router, "use_grouped_topk", False)),
        "routed scaling": float(getattr(runner, "routed_scaling_factor", 1.0) or 1.0) != 1.0,
        f"quantization {type(experts.quant_method).__name__}": type(experts.quant_method).__name__
        != "UnquantizedFusedMoEMethod",
        f"activation {activation}": str(activation) != "silu" or not getattr(config, "is_act_and_mul", True),
        "expert bias": bool(getattr(config, "has_bias", False)),
        "expert parallelism": config.num_local_experts != router.global_num_experts,
    }


def moe_problem(runner: Any) -> Optional[str]:
    problems = [what for what, applies in {**_moe_unsupported(runner), **_moe_unsupported_opaque(runner)}.items()
                if applies]
    return f"{type(runner).__name__} with {', '.join(problems)} (no MoE Definition computes it)" if problems else None


def _opaque(runner: Any) -> Optional[bool]:
    """Whether the runner's experts run inside vLLM's opaque ``moe_forward`` custom op (its GPU
    path): what runs in there is never traced, so no CUDA graph step shows it to a hook. None: this
    vLLM's runner does not say (no ``_forward_entry``)."""
    entry = getattr(runner, "_forward_entry", None)
    return None if entry is None else type(entry).__name__.startswith("OpOverload")


def _moe_unsupported_opaque(runner: Any) -> dict[str, bool]:
    shared = getattr(runner, "_shared_experts", None) is not None
    opaque = _opaque(runner)
    return {
        "shared experts inside vLLM's opaque moe_forward_shared op (not seen in CUDA-graph steps)": shared and bool(opaque),
        "a router applied where fi-profile cannot tell whether graph steps show it (no MoERunner._forward_entry)":
            opaque is None and getattr(runner, "gate", None) is not None,
    }


def _moe(self: Any, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> list:
    """A MoE layer (``MoERunner``): routing and experts as one fused MoE call. A runner that holds
    its router (``gate``) applies it inside the opaque custom op on GPUs, where graph steps never
    show it to the linear hook: its GEMM is recorded here then (and always where vLLM fuses it with
    the shared-expert gate into one F.linear), and the gate layer's own hook leaves it to this one."""
    router, config = self.router, self.moe_config
    seen(self)
    calls = moe(hidden_states, router_logits, {**_moe_unsupported(self), **_moe_unsupported_opaque(self)},
                num_experts=config.num_local_experts, top_k=router.top_k,
                intermediate_size=config.intermediate_size_per_partition, renormalize=bool(router.renormalize))
    gate, fused = getattr(self, "gate", None), bool(getattr(self, "_fse_fuse_gate", False))
    if gate is None or not (_opaque(self) or fused):  # the gate's own hook sees it (traced or eager)
        return calls
    n, k = gemm_size(gate)
    if fused:  # one F.linear over the router and shared-expert gate weights, hooked nowhere else
        n += gemm_size(self.shared_expert_gate)[0]
    gate._fi_profile_recorded_by = "moe"
    seen(gate, getattr(self, "shared_expert_gate", None) if fused else None)
    return [ops.gemm(hidden_states, n, k), *calls]


def _sampler(self: Any, logits: torch.Tensor, k: Optional[torch.Tensor], p: Optional[torch.Tensor]) -> list:
    return [ops.sampling(logits, k is not None, p is not None)]


def _sampler_v2(self: Any, logits: torch.Tensor, idx_mapping_np: np.ndarray) -> list:
    """The V2 model runner's own Sampler (vLLM's default on GPUs since 0.2x): top-k / top-p as its
    per-request states say, from their host copies (no device sync); all-greedy steps take argmax."""
    states, requests = self.sampling_states, idx_mapping_np
    if np.all(states.temperature.np[requests] == 0.0):
        return []
    top_k = bool(np.any(states.top_k.np[requests] != states.vocab_size))
    top_p = bool(np.any(states.top_p.np[requests] != 1.0))
    return [ops.sampling(logits, top_k, top_p)]


POINTS = [
    HookPoint("vllm.model_executor.layers.layernorm", "RMSNorm", ("forward",), "rmsnorm", rmsnorm),
    HookPoint("vllm.model_executor.layers.activation", "SiluAndMul", ("forward",), "silu_and_mul", silu_and_mul),
    HookPoint("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding", ("forward",), "rope", rope),
    HookPoint("vllm.model_executor.layers.linear", "UnquantizedLinearMethod", ("apply",), "gemm", linear),
    # lm_head: the logits projection, and the method it applies (nested calls count once)
    HookPoint("vllm.model_executor.layers.logits_processor", "LogitsProcessor", ("_apply_head",), "gemm", lm_head,
              outside_forward=True),
    HookPoint(
        "vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod", ("apply",), "gemm", linear
    ),
    HookPoint(
        "vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding", ("forward",), "embedding", embedding
    ),
    HookPoint("vllm.model_executor.layers.attention.attention", "Attention", ("forward",), "attention", _attention, live=True,
              traced=_attention_traced),
    HookPoint("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner", ("forward",), "moe", _moe),
    *(
        HookPoint(
            f"vllm.v1.attention.backends.{module}",
            builder,
            ("build",),
            "step",
            _metadata_builder,
            optional=True,
            boundary=True,
        )
        for module, builder in (
            ("cpu_attn", "CPUAttentionMetadataBuilder"),
            ("triton_attn", "TritonAttentionMetadataBuilder"),
            ("flashinfer", "FlashInferMetadataBuilder"),
            ("flash_attn", "FlashAttentionMetadataBuilder"),
        )
    ),
    HookPoint(
        "vllm.v1.sample.ops.topk_topp_sampler",
        "TopKTopPSampler",
        ("forward_native", "forward_cpu", "forward_cuda", "forward_hip", "forward_xpu"),
        "sampling",
        _sampler,
        outside_forward=True,
    ),
    HookPoint("vllm.v1.worker.gpu.sample.sampler", "Sampler", ("sample",), "sampling", _sampler_v2, optional=True,
              outside_forward=True),
    # every engine step that schedules tokens runs a forward, which must be in the record
    HookPoint("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", ("execute_model",), "step", _engine_step, around=True),
    HookPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", ("execute_model",), "step", _engine_step, around=True,
              optional=True),
    # graph mode: each run of a compiled forward (and of a whole-model CUDA graph) in a step
    HookPoint("vllm.compilation.wrapper", "TorchCompileWithNoGuardsWrapper", ("__call__",), "compiled_forward",
              _compiled_forward, optional=True, boundary=True, raw=True),
    *(
        HookPoint(f"vllm.compilation.{module}", wrapper, ("__call__",), "compiled_forward", _cuda_graph_call,
                  optional=True, boundary=True, raw=True)
        for module, wrapper in (("cuda_graph", "CUDAGraphWrapper"), ("breakable_cudagraph", "BreakableCUDAGraphWrapper"))
    ),
    HookPoint("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager", ("run_fullgraph",), "compiled_forward",
              _full_graph_replay, optional=True, boundary=True),
]

#: how each layer of a built model is judged (``run.not_covered``): the hooked layer classes by
#: their own rules; any other layer of vLLM's custom-op or attention bases is a class no hook knows
LAYER_RULES = [
    LayerRule("vllm.model_executor.layers.layernorm:RMSNorm", rmsnorm_problem),
    LayerRule("vllm.model_executor.layers.activation:SiluAndMul", silu_and_mul_problem),
    LayerRule("vllm.model_executor.layers.rotary_embedding.base:RotaryEmbedding", rope_problem),
    LayerRule("vllm.model_executor.layers.attention_layer_base:AttentionLayerBase", attention_problem),
    LayerRule("vllm.model_executor.layers.fused_moe.runner.moe_runner:MoERunner", moe_problem),
    LayerRule("vllm.model_executor.layers.logits_processor:LogitsProcessor", covered),
]
KERNEL_LAYERS = [
    "vllm.model_executor.custom_op:CustomOp",
    "vllm.model_executor.custom_op:PluggableLayer",
    "vllm.model_executor.layers.attention_layer_base:AttentionLayerBase",
]
