"""vLLM's hook points, found by name (vLLM 0.26 on the GPU hosts, 0.32 in CI; neither pinned).

Each entry says which vLLM method is which op and how its arguments map onto the shared op table
in :mod:`fi_profile.capture.ops`. Methods are patched on the class before the model is built, so
CustomOp's ``forward`` (which dispatches to the method it bound at ``__init__``) is wrapped once at
the top, above every backend-specific path.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from fi_profile.capture import ops
from fi_profile.capture.ops import KernelCall
from fi_profile.capture.recorder import RECORDER
from fi_profile.capture.step_attention import Batches, StepAttention
from fi_profile.hooks.layer_calls import embedding, linear, lm_head, moe, rmsnorm, rope, silu_and_mul
from fi_profile.hooks.patching import HookPoint
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
    seq_lens = getattr(common, "_seq_lens_cpu", None)  # the runner's CPU copy: no device sync
    if seq_lens is None:
        seq_lens = common.seq_lens.to("cpu")
    shape = ops.step_shape(common.query_start_loc_cpu, seq_lens)
    RECORDER.begin_step(shape, tokens=shape[0])


def _layout(source: Any) -> Batches:
    """The step's decode and prefill layouts from its metadata. CPU copies of the query starts and
    sequence lengths where the metadata has them: no device sync."""
    query_start_loc = getattr(source, "query_start_loc_cpu", None)
    if query_start_loc is None:
        query_start_loc = source.query_start_loc
    seq_lens = getattr(source, "_seq_lens_cpu", None)
    if seq_lens is None:
        seq_lens = source.seq_lens
    block_table = getattr(source, "block_table_tensor", None)
    if block_table is None:
        block_table = source.block_table
    return ops.paged_batches(query_start_loc, seq_lens, block_table, RECORDER.page_size)


def _layout_source(metadata: Any) -> Any:
    common = STEP.context.get("common")
    if common is not None and common.num_actual_tokens == getattr(metadata, "num_actual_tokens", common.num_actual_tokens):
        return common
    return metadata


def _attention(self: Any, query: torch.Tensor) -> list[KernelCall]:
    from vllm.forward_context import get_forward_context

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


#: routers whose selection is softmax -> top-k (-> renormalize), as the MoE Definitions compute it
_SOFTMAX_TOPK_ROUTERS = ("FusedTopKRouter", "CPURouter")


def _moe(self: Any, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> list:
    """A MoE layer (``MoERunner``): routing and experts as one fused MoE call."""
    router, config, experts = self.router, self.moe_config, self.routed_experts
    activation = getattr(getattr(experts, "activation", None), "value", getattr(experts, "activation", "silu"))
    unsupported = {
        f"router {type(router).__name__}": type(router).__name__ not in _SOFTMAX_TOPK_ROUTERS,
        f"scoring {getattr(router, 'scoring_func', None)}": getattr(router, "scoring_func", None) != "softmax",
        "grouped top-k": bool(getattr(router, "use_grouped_topk", False)),
        "routed scaling": float(getattr(self, "routed_scaling_factor", 1.0) or 1.0) != 1.0,
        f"quantization {type(experts.quant_method).__name__}": type(experts.quant_method).__name__
        != "UnquantizedFusedMoEMethod",
        f"activation {activation}": str(activation) != "silu" or not getattr(config, "is_act_and_mul", True),
        "expert bias": bool(getattr(config, "has_bias", False)),
        "expert parallelism": config.num_local_experts != router.global_num_experts,
    }
    return moe(hidden_states, router_logits, unsupported, num_experts=config.num_local_experts, top_k=router.top_k,
               intermediate_size=config.intermediate_size_per_partition, renormalize=bool(router.renormalize))


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
    HookPoint("vllm.model_executor.layers.logits_processor", "LogitsProcessor", ("_apply_head",), "gemm", lm_head),
    HookPoint(
        "vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod", ("apply",), "gemm", linear
    ),
    HookPoint(
        "vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding", ("forward",), "embedding", embedding
    ),
    HookPoint("vllm.model_executor.layers.attention.attention", "Attention", ("forward",), "attention", _attention, live=True),
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
    ),
    HookPoint("vllm.v1.worker.gpu.sample.sampler", "Sampler", ("sample",), "sampling", _sampler_v2, optional=True),
]
