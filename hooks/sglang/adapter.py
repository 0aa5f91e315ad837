"""SGLang's hook points, found by name (SGLang 0.5.23 in CI; neither it nor the GPU bundle's
0.5.16 pinned). Same op table as vLLM (:mod:`fi_profile.capture.ops`), page size 1.

The step boundary is ``ModelRunner.forward(forward_batch)``: the batch has the step's layout
(``extend_seq_lens_cpu`` for extend steps, one token per request for decode, ``seq_lens_cpu``),
and the model runner has the request-to-token table whose rows are the page ids (page size 1).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture import ops
from fi_profile.capture.ops import KernelCall
from fi_profile.capture.recorder import RECORDER
from fi_profile.capture.step_attention import Batches, StepAttention
from fi_profile.hooks.graph_capture import CAPTURED, capturing
from fi_profile.hooks.graph_runs import count_graph_run
from fi_profile.hooks.layer_calls import (
    LayerRule,
    covered,
    embedding,
    linear,
    lm_head,
    moe,
    require,
    rmsnorm,
    rmsnorm_problem,
    rope,
    rope_problem,
    seen,
    seen_weights,
    silu_and_mul,
    silu_and_mul_problem,
)
from fi_profile.hooks.patching import HookPoint
from fi_profile.schema.dtype import schema_dtype

#: the step's model runner (its request-to-token table holds the page ids) and attention layout:
#: the attention layers of one step share one ForwardBatch, which may not be the object
#: ``ModelRunner.forward`` received
STEP = StepAttention()


def _layout(batch: Any) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(query start offsets, sequence lengths) on the CPU, or None for a step without requests."""
    mode = batch.forward_mode
    seq_lens = getattr(batch, "seq_lens_cpu", None)
    if seq_lens is None:
        seq_lens = batch.seq_lens.to("cpu")
    if mode.is_decode():
        q_lens = torch.ones(len(seq_lens), dtype=torch.int64)
    elif mode.is_extend():
        q_lens = torch.as_tensor(batch.extend_seq_lens_cpu, dtype=torch.int64)
    else:  # idle / dummy steps run no model work worth recording
        return None
    return torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]), seq_lens.to(torch.int64)


def _model_step(self: Any, forward_batch: Any) -> Any:
    """``ModelRunner.forward``: one model step, the step boundary. A step with requests runs the
    model's forward, which must be in the record (:meth:`~fi_profile.capture.recorder.Recorder.engine_step`)."""
    if not RECORDER.active:
        return contextlib.nullcontext()
    STEP.begin(runner=self, batch=forward_batch)
    layout = _layout(forward_batch)
    if layout is None:
        return contextlib.nullcontext()
    shape = ops.step_shape(layout[0], len(layout[1]))
    RECORDER.begin_step(shape, tokens=shape[0])
    mode = getattr(forward_batch.forward_mode, "name", "model").lower()
    return RECORDER.engine_step(f"a {mode} step of {shape[0]} tokens for {len(layout[1])} requests")


#: SGLang's CUDA graph backends that capture by running the model's Python forward (its layer
#: calls are kept while captured: :mod:`fi_profile.hooks.graph_capture`), and how each replays
_CAPTURED_BACKENDS = {"FullCudaGraphBackend": "full_cuda_graph", "BreakableCudaGraphBackend": "piecewise_cuda_graph"}


def _graph_runner_runs(self: Any) -> None:
    """One of SGLang's graph runners runs this step (``execute``): its layer calls are recorded only
    where its backend captured them by running the model (replayed in :func:`_graph_replay`); any
    other (the CPU graph runner, torch.compile backends) is said, never silently dropped."""
    backend = type(getattr(self, "backend", None)).__name__
    if backend not in _CAPTURED_BACKENDS:
        raise NotImplementedError(
            f"this step runs SGLang's {type(self).__name__} ({backend}), whose layer calls fi-profile does not "
            "record: they are not in the record (capture with --eager)"
        )


def _graph_capture(self: Any, shape_key: Any) -> Any:
    """A CUDA graph backend's ``capture_one``: the layer calls made while it captures are the graph's."""
    return capturing((self, shape_key), where="cuda_graph")


def _graph_replay(self: Any, shape_key: Any) -> None:
    """A CUDA graph backend's ``replay``: the graph's captured calls, at its (padded) size."""
    trace = CAPTURED.get((self, shape_key))
    if trace is None or not trace.templates:
        raise RuntimeError(
            f"SGLang's {type(self).__name__} replayed a CUDA graph of size {shape_key.size} in which no hooked layer "
            "call was captured (compiled with torch.compile, or captured before the hooks were installed): its calls "
            "are not in the record (capture with --eager)"
        )
    count_graph_run(trace, {}, _CAPTURED_BACKENDS.get(type(self).__name__, "cuda_graph"), int(shape_key.size))


def _batches(batch: Any) -> Batches:
    layout, runner = _layout(batch), STEP.context.get("runner")
    if layout is None or runner is None:
        return None, None
    table = runner.req_to_token_pool.req_to_token[batch.req_pool_indices]  # page size 1: rows are page ids
    return ops.paged_batches(*layout, table, 1)


def attention_problem(layer: Any) -> Optional[str]:
    """Why an attention layer is not a paged GQA call the Definitions compute, or None: only
    ``RadixAttention`` as plain causal decoder self-attention (MLA runs through the same class with
    a latent value head; windows, soft caps, cross attention are other computations)."""
    name = type(layer).__name__
    if name != "RadixAttention":
        return f"{name} (an attention layer class no Definition computes)"
    attn_type = str(getattr(getattr(layer, "attn_type", "decoder"), "value", getattr(layer, "attn_type", "decoder")))
    features = {
        f"latent attention (MLA: value head {getattr(layer, 'v_head_dim', None)} of qk head {layer.head_dim})":
            getattr(layer, "v_head_dim", layer.head_dim) != layer.head_dim,
        f"attention type {attn_type}": attn_type.lower() not in ("decoder", "attentiontype.decoder"),
        f"sliding window {getattr(layer, 'sliding_window_size', -1)}": (getattr(layer, "sliding_window_size", -1) or -1) != -1,
        "logit cap": bool(getattr(layer, "logit_cap", 0) or 0),
        "cross attention": bool(getattr(layer, "is_cross_attention", False)),
    }
    problems = [what for what, applies in features.items() if applies]
    return f"RadixAttention with {', '.join(problems)} (no Definition computes it)" if problems else None


def _attention(self: Any, q: torch.Tensor, forward_batch: Any) -> list[KernelCall]:
    seen(self)
    require(attention_problem(self))
    STEP.batches(forward_batch, _batches)
    return STEP.calls((self.tp_q_head_num, self.tp_k_head_num, self.head_dim, 1, RECORDER.num_pages or 0,
                       schema_dtype(q.dtype), float(self.scaling)))


def _attention_captured(self: Any, q: torch.Tensor) -> Callable[[], list[KernelCall]]:
    """While a CUDA graph captures an attention layer: its shape, and how to build its calls in
    each step that replays the graph, from that step's batch (the replay runs no Python layer)."""
    seen(self)
    require(attention_problem(self))
    return functools.partial(_attention_in_graph, (self.tp_q_head_num, self.tp_k_head_num, self.head_dim,
                                                   schema_dtype(q.dtype), float(self.scaling)))


def _attention_in_graph(layer: tuple) -> list[KernelCall]:
    batch = STEP.context.get("batch")
    if batch is None:
        raise RuntimeError("a CUDA graph replayed outside a model step: its attention layout is unknown")
    STEP.batches(batch, _batches)
    heads, kv_heads, head_dim, dtype, scale = layer
    return STEP.calls((heads, kv_heads, head_dim, 1, RECORDER.num_pages or 0, dtype, scale))


def _moe_routing(self: Any, router_logits: torch.Tensor) -> list:
    """``TopK``: no kernel of its own here; the routing it does is part of the MoE call that the
    experts layer right after it records (one fused MoE call, as for vLLM)."""
    seen(self)
    STEP.context["moe_routing"] = (router_logits, self.topk_config)
    return []


def _routing_unsupported(config: Any, runner: Any = None) -> dict[str, bool]:
    """What a ``TopK`` router (its ``topk_config``) does that no MoE Definition computes."""
    scaling = getattr(config, "routed_scaling_factor", None) or getattr(runner, "routed_scaling_factor", None)
    scoring = getattr(config, "scoring_func", "softmax")
    return {
        f"scoring {scoring}": scoring != "softmax",
        "grouped top-k": bool(getattr(config, "use_grouped_topk", False)),
        "custom routing": getattr(config, "custom_routing_function", None) is not None,
        "correction bias": getattr(config, "correction_bias", None) is not None,
        "fused shared experts": bool(getattr(config, "num_fused_shared_experts", 0)),
        "routed scaling": scaling not in (None, 1.0),
    }


def routing_problem(router: Any) -> Optional[str]:
    problems = [what for what, applies in _routing_unsupported(router.topk_config).items() if applies]
    return f"{type(router).__name__} with {', '.join(problems)} (no MoE Definition computes it)" if problems else None


def _moe(self: Any, hidden_states: torch.Tensor) -> list:
    """``FusedMoE``: routing (from the ``TopK`` call before it) and SwiGLU experts as one call."""
    routing = STEP.context.pop("moe_routing", None)
    if routing is None:
        raise RuntimeError("MoE experts called without a TopK call before them: routing unknown")
    router_logits, config = routing
    runner = self.moe_runner_config
    unsupported = {
        **_routing_unsupported(config, runner),
        f"quantization {type(self.quant_method).__name__}": type(self.quant_method).__name__ != "UnquantizedFusedMoEMethod",
        f"activation {runner.activation}": runner.activation != "silu" or not getattr(runner, "is_gated", True),
        "router weight on input": bool(getattr(runner, "apply_router_weight_on_input", False)),
        "expert parallelism": self.num_local_experts != self.num_experts,
    }
    return moe(hidden_states, router_logits, unsupported, num_experts=self.num_experts, top_k=config.top_k,
               intermediate_size=self.intermediate_size_per_partition, renormalize=bool(config.renormalize))


def _fused_qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                   eps: float = 1e-6) -> list:
    """SGLang's ``fused_inplace_qknorm`` (Qwen3's q/k norms on CUDA, one kernel for both, called with
    the RMSNorm layers' weights instead of the layers)."""
    seen_weights(q_weight, k_weight)
    return [ops.qk_rmsnorm(q, k, float(eps))]


def _sampler(self: Any, logits_output: Any, sampling_info: Any) -> list:
    if sampling_info.is_all_greedy:
        return []
    top_k, top_p = bool(sampling_info.need_top_k_sampling), bool(sampling_info.need_top_p_sampling)
    return [ops.sampling(logits_output.next_token_logits, top_k, top_p)]


POINTS = [
    HookPoint("sglang.srt.layers.layernorm", "RMSNorm", ("forward",), "rmsnorm", rmsnorm),
    HookPoint("sglang.srt.layers.activation", "SiluAndMul", ("forward",), "silu_and_mul", silu_and_mul),
    HookPoint("sglang.srt.layers.rotary_embedding.base", "RotaryEmbedding", ("forward",), "rope", rope),
    HookPoint("sglang.srt.layers.quantization.unquant", "UnquantizedLinearMethod", ("apply",), "gemm", linear),
    # lm_head: the logits projection, and the method it may apply (nested calls count once)
    HookPoint("sglang.srt.layers.logits_processor", "LogitsProcessor", ("_compute_lm_head",), "gemm", lm_head),
    HookPoint("sglang.srt.layers.quantization.unquant", "UnquantizedEmbeddingMethod", ("apply",), "gemm", linear),
    HookPoint("sglang.srt.layers.vocab_parallel_embedding", "VocabParallelEmbedding", ("forward",), "embedding", embedding),
    HookPoint("sglang.srt.layers.radix_attention", "RadixAttention", ("forward",), "attention", _attention, live=True,
              traced=_attention_captured),
    HookPoint("sglang.srt.layers.moe.topk", "TopK", ("forward",), "moe_routing", _moe_routing),
    HookPoint("sglang.srt.layers.moe.fused_moe_triton.layer", "FusedMoE", ("forward",), "moe", _moe,
              nested=("silu_and_mul", "gemm")),
    # a kernel function the models call with the norm layers' weights (looked up in this module)
    HookPoint("sglang.srt.models.utils", "", ("fused_inplace_qknorm",), "qk_rmsnorm", _fused_qk_norm, optional=True),
    HookPoint("sglang.srt.layers.sampler", "Sampler", ("forward",), "sampling", _sampler, outside_forward=True),
    HookPoint("sglang.srt.model_executor.model_runner", "ModelRunner", ("forward",), "step", _model_step, around=True),
    # graph mode: a graph runner runs a step; the calls each CUDA graph captured, and each replay of it
    *(
        HookPoint(f"sglang.srt.model_executor.{module}", runner, ("execute",), "graph_step", _graph_runner_runs,
                  boundary=True)
        for module, runner in (("runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner"),
                               ("runner.prefill_cuda_graph_runner", "PrefillCudaGraphRunner"),
                               ("cpu_graph_runner", "CPUGraphRunner"))
    ),
    *(
        point
        for module, backend in (("full_cuda_graph_backend", "FullCudaGraphBackend"),
                                ("breakable_cuda_graph_backend", "BreakableCudaGraphBackend"))
        for point in (
            HookPoint(f"sglang.srt.model_executor.runner_backend.{module}", backend, ("capture_one",), "graph_capture",
                      _graph_capture, around=True),
            HookPoint(f"sglang.srt.model_executor.runner_backend.{module}", backend, ("replay",), "graph_replay",
                      _graph_replay, boundary=True),
        )
    ),
]

#: how each layer of a built model is judged (``run.not_covered``): the hooked layer classes by
#: their own rules; any other layer of SGLang's op bases (they moved between versions) is a class
#: no hook knows
LAYER_RULES = [
    LayerRule("sglang.srt.layers.layernorm:RMSNorm", rmsnorm_problem),
    LayerRule("sglang.srt.layers.activation:SiluAndMul", silu_and_mul_problem),
    LayerRule("sglang.srt.layers.rotary_embedding.base:RotaryEmbedding", rope_problem),
    LayerRule("sglang.srt.layers.radix_attention:RadixAttention", attention_problem),
    LayerRule("sglang.srt.layers.moe.topk:TopK", routing_problem),
    LayerRule("sglang.srt.layers.logits_processor:LogitsProcessor", covered),
]
KERNEL_LAYERS = [
    "sglang.kernels.fused_op:BaseFusedOp",
    "sglang.srt.layers.utils.multi_platform:MultiPlatformOp",
    "sglang.srt.custom_op:CustomOp",
    "sglang.srt.layers.radix_attention:RadixAttention",
]
