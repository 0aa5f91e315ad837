"""vLLM's attention layers as the attention family's calls: the step's layout read from the
attention metadata its backends are built from (the metadata builder is the step boundary), and
each ``Attention`` layer's shape.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import KnownAttributes, judged_once, require, seen
from fi_profile.capture.paged_layout import paged_batches, step_shape
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import attention, fp8_linear, kv_cache
from fi_profile.families.attention.step import Batches, StepAttention
from fi_profile.schema.dtype import schema_dtype, torch_dtype

STEP = StepAttention()


def metadata_builder(self: Any, common_attn_metadata: Any) -> None:
    """Step boundary. Keeps the step's CommonAttentionMetadata: every backend is built from it,
    and it has the layout (query_start_loc, seq_lens, block_table_tensor) even where the
    backend's own metadata holds only planned wrappers (FlashInfer). The step's signature is
    what fixes every var axis of the step: token count, request count, decode/prefill layout."""
    common = common_attn_metadata
    if type(self).__name__ == CHUNKED_BUILDER:
        # chunked local attention's builder, passing its own chunk-sized virtual requests on to the
        # backend's: not the step's layout (its layers are recorded from the real one, with their chunk)
        return
    STEP.begin(common=common)
    if common is None or RECORDER.page_size is None:
        return
    shape = step_shape(common.query_start_loc_cpu, int(getattr(common, "num_reqs", len(common.query_start_loc_cpu) - 1)))
    RECORDER.begin_step(shape, tokens=shape[0])


#: vLLM's builder of chunked local attention's metadata (a subclass of each backend's builder,
#: whose ``build`` rewrites the requests into one virtual request per chunk before calling the backend's)
CHUNKED_BUILDER = "ChunkedLocalAttentionBuilder"
#: vLLM's attention layer classes the GQA Definitions compute: plain, and Llama-4's chunked local
COVERED_CLASSES = ("Attention", "ChunkedLocalAttention")


def _host_seq_lens(source: Any) -> Any:
    """The requests' KV lengths without a device sync (one per step would break vLLM's async
    scheduling): the V1 runner's CPU copy, else the V2 runner's host upper bound (exact but for
    async speculative decoding), else the device tensor (copied: a sync)."""
    for name in ("_seq_lens_cpu", "seq_lens_cpu_upper_bound"):
        found = getattr(source, name, None)
        if found is not None:
            return found
    return source.seq_lens


def layout(source: Any) -> Batches:
    """The step's decode and prefill layouts from its metadata. CPU copies of the query starts and
    sequence lengths where the metadata has them: no device sync. Decode requests are those of one
    query token, or up to the backend's decode threshold where its builder said one (MLA's)."""
    query_start_loc = getattr(source, "query_start_loc_cpu", None)
    if query_start_loc is None:
        query_start_loc = source.query_start_loc
    seq_lens = _host_seq_lens(source)
    block_table = getattr(source, "block_table_tensor", None)
    if block_table is None:
        block_table = source.block_table
    return paged_batches(query_start_loc, seq_lens, block_table, RECORDER.page_size,
                         STEP.context.get("decode_max_query", 1))


def _layout_source(metadata: Any) -> Any:
    common = STEP.context.get("common")
    if common is not None and common.num_actual_tokens == getattr(metadata, "num_actual_tokens", common.num_actual_tokens):
        return common
    return metadata


#: vLLM's names of an FP8 e4m3 KV cache with one static scale per tensor (``kv_cache_dtype``)
FP8_CACHES = ("fp8", "fp8_e4m3")
#: attention implementations whose FP8-cache path the ``*_kv_fp8`` Definitions compute: vLLM's
#: Triton unified attention, which dequantizes the cache by the layer's scales in the kernel, its
#: queries in the model's dtype or (on CUDA, where the layer quantizes them first by its static
#: per-tensor ``q_scale``) in FP8 (``*_q_fp8_kv_fp8``). Others (FlashAttention 3, FlashInfer's
#: TRT-LLM kernels) are not known here: listed.
FP8_CACHE_IMPLS = ("TritonAttentionImpl",)


def fp8_cache(layer: Any) -> bool:
    """Whether the layer's KV cache is FP8 (e4m3) by its ``kv_cache_dtype`` (GQA and MLA layers alike)."""
    return str(getattr(layer, "kv_cache_dtype", "auto")) in FP8_CACHES


def _cache_problem(layer: Any) -> Optional[str]:
    """Why the layer's KV cache is neither of the model's dtype nor an FP8 cache the ``*_kv_fp8``
    Definitions compute, or None."""
    kv_cache = str(getattr(layer, "kv_cache_dtype", "auto"))
    impl = type(getattr(layer, "impl", None)).__name__
    if kv_cache in ("auto", "bfloat16", "float16"):
        return None
    if not fp8_cache(layer):
        return f"KV cache {kv_cache}"
    if impl not in FP8_CACHE_IMPLS:
        return f"KV cache {kv_cache} on {impl}"
    quant = getattr(layer, "query_quant", None)
    if quant is not None and (not getattr(quant, "static", False) or _group(quant) != (-1, -1)):
        return f"KV cache {kv_cache} with the queries quantized to FP8 otherwise than by one static scale ({_group(quant)})"
    if getattr(layer, "calculate_kv_scales", False):
        return f"KV cache {kv_cache} with scales computed from the first forward (calculate_kv_scales)"
    return None


def _group(quant: Any) -> Optional[tuple[int, ...]]:
    """A ``QuantFP8``'s scale group shape (rows, columns; -1: all), or None where it does not say."""
    try:
        return tuple(int(size) for size in quant.group_shape)
    except (AttributeError, TypeError, ValueError):
        return None


def query_scale(layer: Any) -> Optional[float]:
    """The static per-tensor scale the layer quantizes its queries to FP8 by before attention (vLLM
    on CUDA with an FP8 cache: ``query_quant``), or None where the queries stay in the model's dtype."""
    return None if getattr(layer, "query_quant", None) is None else float(layer._q_scale_float)


def _query_quant(layer: Any, tokens: int, dtype: Any) -> list[KernelCall]:
    """The queries' static FP8 quantization, a kernel before the cache write and attention, where the
    layer quantizes them."""
    if query_scale(layer) is None:
        return []
    return [fp8_linear.static_quant_call(tokens, layer.num_heads * layer.head_size, torch_dtype(dtype))]


def cache_scales(layer: Any) -> Optional[tuple[float, float]]:
    """An FP8 cache's (k_scale, v_scale), as the layer holds them on the host; None for a cache of
    the model's dtype."""
    return (float(layer._k_scale_float), float(layer._v_scale_float)) if fp8_cache(layer) else None


#: what the hook knows of an ``Attention`` layer's attributes (vLLM 0.26 and 0.32): any other is
#: listed by name (:class:`~fi_profile.capture.layers.KnownAttributes`)
LAYER_ATTRIBUTES = KnownAttributes(
    read=frozenset({"num_heads", "head_size", "head_size_v", "num_kv_heads", "sliding_window", "has_sink",
                    "kv_cache_dtype", "attn_type", "kv_sharing_target_layer_name", "query_quant", "impl", "dtype",
                    "calculate_kv_scales", "_q_scale_float", "_k_scale_float", "_v_scale_float"}),
    # read for a ChunkedLocalAttention only (:func:`variant`)
    neutral={"attention_chunk_size": None, "use_mm_prefix": False, "use_alibi_sqrt": False,
             "mm_prefix_clamp_sliding_window": False, "_prob_scale_float": 1.0, "_o_scale_float": None},
    inert=frozenset({"kv_cache_torch_dtype", "quant_config", "quant_method", "layer_name", "attn_backend", "backend",
                     "use_direct_call", "kv_cache", "isa", "_k_scale_cpu", "_v_scale_cpu", "_q_scale_cpu",
                     "_k_scale", "_v_scale", "_q_scale", "_prob_scale", "k_scale", "v_scale", "q_scale", "prob_scale",
                     "q_range", "k_range", "v_range"}),
)
#: the same of its implementation (vLLM's CPU, Triton, FlashInfer and FlashAttention backends)
IMPL_ATTRIBUTES = KnownAttributes(
    read=frozenset({"num_heads", "head_size", "num_kv_heads", "scale", "sliding_window", "window_left",
                    "logits_soft_cap", "sinks", "kv_cache_dtype", "attn_type", "kv_sharing_target_layer_name"}),
    neutral={"alibi_slopes": None, "use_alibi_sqrt": False, "chunk_lookback": -1, "dcp_world_size": 1,
             "pcp_world_size": 1, "total_cp_world_size": 1, "need_to_return_lse_for_decode": False,
             "_is_per_token_head_quant": False},
    inert=frozenset({"dcp_rank", "pcp_rank", "total_cp_rank", "num_queries_per_kv", "is_fp8_kv_cache",
                     "use_zentorch_sdpa", "fp8_dtype", "supports_quant_query_input", "use_td", "_kv_quant_mode",
                     "_k_scale_cache", "_v_scale_cache", "cache_dtype", "bmm1_scale", "bmm2_scale", "o_sf_scale",
                     "fp4_data_dim", "is_kvcache_nvfp4", "nvfp4_fa2", "nvfp4_trtllm", "_nvfp4_fp8_out", "_sinks_source",
                     "supports_xqa_or_trtllm_gen_decode", "vllm_first_call", "_dcp_dtype", "_dcp_max_num_tokens",
                     "batch_invariant_enabled", "fa4_hd256", "vllm_flash_attn_version", "dcp_combine",
                     "can_return_lse_for_decode"}),
)


def variant(layer: Any) -> attention.Variant:
    """What the layer computes beyond plain causal attention: vLLM's ``sliding_window`` (W keys per
    query, itself included), its implementation's logit soft cap (0 or None: none) and sinks, and a
    ``ChunkedLocalAttention``'s ``attention_chunk_size``."""
    impl = layer.impl
    cap = getattr(impl, "logits_soft_cap", None)
    chunk = getattr(layer, "attention_chunk_size", None) if type(layer).__name__ == "ChunkedLocalAttention" else None
    return attention.Variant(window=getattr(layer, "sliding_window", None), soft_cap=float(cap) if cap else None,
                             sinks=getattr(impl, "sinks", None) is not None, chunk=int(chunk) if chunk else None)


def _window_problem(layer: Any) -> Optional[str]:
    """Why the implementation's window is not the layer's ``sliding_window`` (vLLM's CPU backend
    holds W or -1, its Triton and FlashAttention backends (W - 1, 0) or (-1, -1), FlashInfer's
    ``window_left`` W - 1 or -1), or None."""
    window = getattr(layer, "sliding_window", None)
    impl = layer.impl
    held = getattr(impl, "sliding_window", None)
    left = -1 if window is None else window - 1
    agrees = held is None or held in (window, (left, 0)) or (window is None and held in (-1, (-1, -1)))
    if agrees and getattr(impl, "window_left", left) == left:
        return None
    return f"a window the layer and its implementation disagree on (layer {window}, impl {held})"


def layer_problem(layer: Any) -> Optional[str]:
    """Why an attention layer is not a paged GQA call the Definitions compute, or None: only
    vLLM's ``Attention`` itself (MLA, chunked-local, encoder and cross attention are other classes),
    causal decoder self-attention, with a sliding window, a logit soft cap or sinks where it has
    them (:func:`variant`), its KV cache of the model's dtype or (plain attention only) FP8 (e4m3)
    with static scales on vLLM's Triton attention (its queries quantized first by one static scale
    where vLLM does so). Every other attribute of the layer and its implementation that may change
    what it computes is judged against what the hook knows, and listed by name where unknown."""
    attn_type = str(getattr(getattr(layer, "attn_type", "decoder"), "value", getattr(layer, "attn_type", "decoder")))
    cache = _cache_problem(layer)
    impl = getattr(layer, "impl", None)
    chunked = type(layer).__name__ == "ChunkedLocalAttention"
    unknown = LAYER_ATTRIBUTES.problems(layer, ignore=("attention_chunk_size",) if chunked else ()) + (
        IMPL_ATTRIBUTES.problems(impl, "impl.") if impl is not None else [])
    window = _window_problem(layer) if impl is not None else None
    kind = attention.PLAIN if impl is None else variant(layer)
    return attention.layer_problem(layer, COVERED_CLASSES, {
        "chunked attention with sinks": kind.chunk is not None and kind.sinks,
        f"attention type {attn_type}": attn_type.lower() != "decoder",
        f"value head {getattr(layer, 'head_size_v', None)} of head {getattr(layer, 'head_size', None)}":
            getattr(layer, "head_size_v", getattr(layer, "head_size", None)) != getattr(layer, "head_size", None),
        str(window): window is not None,
        str(cache): cache is not None,
        f"attention{kind.suffix()} over an FP8 KV cache": not kind.plain and fp8_cache(layer),
        **{what: True for what in unknown},
    })


def _writes_cache(layer: Any, key: Optional[torch.Tensor]) -> bool:
    """Whether the layer writes its new keys and values to the KV cache (not one sharing another
    layer's cache)."""
    return key is not None and getattr(layer, "kv_sharing_target_layer_name", None) is None


def slot_mapping(layer_name: Optional[str]) -> torch.Tensor:
    """Where the layer writes its new tokens in the KV cache: the forward context's slot mapping,
    per layer, padded with -1 for a CUDA graph as the kernel runs it; else the step's metadata's.
    ``layer_name`` None: a layer of a compiled forward, whose slots are any layer's of the step
    (one KV-cache group: the same for all)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    found = None
    if is_forward_context_available():
        by_layer = getattr(get_forward_context(), "slot_mapping", None)
        if isinstance(by_layer, list):  # micro-batches: the first one's
            by_layer = by_layer[0] if by_layer else None
        if isinstance(by_layer, dict) and by_layer:
            found = by_layer.get(layer_name) if layer_name is not None else next(iter(by_layer.values()))
    if found is None:
        found = getattr(STEP.context.get("common"), "slot_mapping", None)
    if found is None:
        raise RuntimeError("the step's slot mapping (where the KV cache is written) is unknown")
    return found


def _cache_write(layer_name: Optional[str], kv_heads: int, head_size: int, dtype: Any,
                 scales: Optional[tuple[float, float]]) -> list[KernelCall]:
    """The layer's KV-cache write in this step, over its slot mapping (quantizing by ``scales`` to
    an FP8 cache)."""
    slots = slot_mapping(layer_name)
    return [kv_cache.call(int(slots.shape[0]), kv_heads, head_size, RECORDER.page_size or 0,
                          RECORDER.num_pages or 0, dtype, kv_cache.slots(slots), scales)]


def layer_calls(self: Any, query: torch.Tensor, key: Optional[torch.Tensor] = None) -> list[KernelCall]:
    """``Attention.forward``: the step's layout from the forward context's metadata; the layer's
    KV-cache write first, as it runs."""
    from vllm.forward_context import get_forward_context

    seen(self)
    require(judged_once(self, layer_problem))
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
    STEP.batches(_layout_source(metadata), layout)
    dtype, scales = schema_dtype(query.dtype), cache_scales(self)
    writes = _cache_write(self.layer_name, self.num_kv_heads, self.head_size, dtype, scales) \
        if _writes_cache(self, key) else []
    return _query_quant(self, int(query.shape[0]), dtype) + writes + STEP.calls((
        self.num_heads, self.num_kv_heads, self.head_size, page_size, RECORDER.num_pages or 0, dtype,
        float(self.impl.scale), scales, query_scale(self), variant(self)))


def traced_layer_calls(self: Any, query: torch.Tensor, key: Optional[torch.Tensor] = None) -> Callable[[], list[KernelCall]]:
    """While torch.compile traces an attention layer: its shape, and how to build its calls in each
    step from the step's metadata (the attention op of a compiled or CUDA-graph forward runs no
    Python hook; the metadata builder runs on the host every step)."""
    seen(self)
    require(layer_problem(self))
    layer = (self.num_heads, self.num_kv_heads, self.head_size, schema_dtype(query.dtype), float(self.impl.scale),
             cache_scales(self), query_scale(self), variant(self))
    return functools.partial(_calls_in_graph, layer, _writes_cache(self, key))


def _calls_in_graph(layer: tuple, writes: bool = False) -> list[KernelCall]:
    """A compiled or CUDA-graph forward's attention layer in this step (``writes``: it writes the
    KV cache)."""
    common = STEP.context.get("common")
    if common is None or RECORDER.page_size is None:
        raise RuntimeError("a compiled forward ran without the step's attention metadata")
    STEP.batches(common, layout)
    heads, kv_heads, head_size, dtype, scale, scales, q_scale, kind = layer
    written = _cache_write(None, kv_heads, head_size, dtype, scales) if writes else []
    # the queries' quantization runs on the step's tokens as the graph runs them (its padded batch)
    quant = [] if q_scale is None else [
        fp8_linear.static_quant_call(int(slot_mapping(None).shape[0]), heads * head_size, torch_dtype(dtype))]
    return quant + written + STEP.calls((heads, kv_heads, head_size, RECORDER.page_size, RECORDER.num_pages or 0, dtype,
                                         scale, scales, q_scale, kind))
