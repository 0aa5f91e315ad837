"""SGLang's attention layers (``RadixAttention``) as the attention family's calls: the step's
layout from its ForwardBatch and the model runner's request-to-token table (page size 1: its
rows are the page ids)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import KnownAttributes, judged_once, require, seen
from fi_profile.capture.paged_layout import paged_batches
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import attention, kv_cache
from fi_profile.families.attention.step import Batches, StepAttention
from fi_profile.schema.dtype import DType, schema_dtype

#: the step's model runner (its request-to-token table holds the page ids) and attention layout:
#: the attention layers of one step share one ForwardBatch, which may not be the object
#: ``ModelRunner.forward`` received
STEP = StepAttention()


def step_layout(batch: Any) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
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


def request_pages(batch: Any) -> torch.Tensor:
    """The step's requests' rows of the request-to-token table (page size 1: its rows are page ids)."""
    runner = STEP.context.get("runner")
    if runner is None:
        raise RuntimeError("the step's model runner is unknown: its request-to-token table holds the page ids")
    return runner.req_to_token_pool.req_to_token[batch.req_pool_indices]


def step_batches(batch: Any) -> Batches:
    """The step's (decode, prefill) layouts."""
    layout = step_layout(batch)
    if layout is None or STEP.context.get("runner") is None:
        return None, None
    return paged_batches(*layout, request_pages(batch), 1)


#: what the hook knows of a ``RadixAttention`` layer's attributes (SGLang 0.5.16 and 0.5.23): any
#: other is listed by name (:class:`~fi_profile.capture.layers.KnownAttributes`)
LAYER_ATTRIBUTES = KnownAttributes(
    read=frozenset({"tp_q_head_num", "tp_k_head_num", "tp_v_head_num", "head_dim", "qk_head_dim", "v_head_dim",
                    "scaling", "logit_cap", "logit_capping_method", "sliding_window_size", "is_cross_attention",
                    "attn_type", "k_scale", "v_scale", "k_scale_float", "v_scale_float", "use_irope"}),
    neutral={"pos_encoding_mode": "NONE", "idx_q_scale_float": None, "idx_k_scale_float": None,
             "idx_v_scale_float": None},
    inert=frozenset({"layer_id", "use_prefill_attention_wrapper", "quant_method", "q_scale_float", "q_scale",
                     "prob_scale"}),
)
#: the keyword arguments of ``RadixAttention.forward`` a GQA layer may pass that the hook reads
FORWARD_KEYWORDS = frozenset({"sinks"})
#: SGLang's attention backends and the variant parts each computes (a window: ``sliding_window_size``
#: keys to the left; a tanh logit cap; sinks passed to the layer's forward): its ``torch_native``
#: backend (CPU) masks by the window and ignores a cap and sinks
VARIANT_BACKENDS = {"TritonAttnBackend": ("window", "soft_cap", "sinks"), "TorchNativeAttnBackend": ("window",)}


def variant(layer: Any, sinks: Any = None) -> attention.Variant:
    """What the layer computes beyond plain causal attention: SGLang's ``sliding_window_size`` is
    FlashInfer's ``window_left`` (W - 1: vLLM's and HF's window of W keys), its tanh ``logit_cap``,
    and the ``sinks`` its model passes to the layer's forward (gpt-oss)."""
    left = getattr(layer, "sliding_window_size", -1)
    left = -1 if left is None else int(left)
    cap = float(getattr(layer, "logit_cap", 0.0) or 0.0)
    return attention.Variant(window=left + 1 if left >= 0 else None, soft_cap=cap if cap > 0 else None,
                             sinks=sinks is not None)


def _attention_type(layer: Any) -> str:
    kind = getattr(layer, "attn_type", "decoder")
    return str(getattr(kind, "value", kind)).lower().removeprefix("attentiontype.")


#: a layer SGLang builds as ``DECODER_BIDIRECTIONAL`` (Gemma-3 in 0.5.16, EmbeddingGemma) attends
#: causally on these backends: its ``torch_native`` one always; its ``triton`` one unless it allows
#: bidirectional extends (CUDA graphs off and no chunked prefill), which it says itself
BIDIRECTIONAL_CAUSAL_BACKENDS = ("TorchNativeAttnBackend", "TritonAttnBackend")
#: SGLang's attention backends that attend over every key whatever a layer's ``use_irope`` (Llama-4's
#: chunked layers) says: they read no ``attention_chunk_size`` (only its FA3 and XPU backends chunk)
IROPE_UNCHUNKED_BACKENDS = ("TorchNativeAttnBackend", "TritonAttnBackend")


def layer_problem(layer: Any) -> Optional[str]:
    """Why an attention layer is not a paged GQA call the Definitions compute, or None: only
    ``RadixAttention`` as causal decoder self-attention (MLA runs through the same class with a
    latent value head), with a sliding window or a tanh logit cap where it has them
    (:func:`variant`); every other attribute that may change what it computes is judged against
    what the hook knows, and listed by name where unknown. What the step's backend makes of a
    bidirectional decoder or ``use_irope`` is judged where the backend is known
    (:func:`_backend_reading_problem`)."""
    attn_type = _attention_type(layer)
    head_dim = getattr(layer, "head_dim", None)
    method = getattr(layer, "logit_capping_method", "tanh")
    return attention.layer_problem(layer, "RadixAttention", {
        f"latent attention (MLA: value head {getattr(layer, 'v_head_dim', None)} of qk head {head_dim})":
            getattr(layer, "v_head_dim", head_dim) != head_dim,
        f"attention type {attn_type}": attn_type not in ("decoder", "decoder_bidirectional"),
        f"logit capping method {method}": bool(getattr(layer, "logit_cap", 0) or 0) and method != "tanh",
        "cross attention": bool(getattr(layer, "is_cross_attention", False)),
        **{what: True for what in LAYER_ATTRIBUTES.problems(layer)},
    })


def _keyword_problem(extra: Mapping[str, Any]) -> Optional[str]:
    """A keyword argument of the layer's forward (beyond its own) that the hook does not know."""
    unknown = sorted(name for name, value in extra.items() if name not in FORWARD_KEYWORDS and value is not None)
    if unknown:
        return f"RadixAttention called with {', '.join(unknown)} (arguments fi-profile does not know: no Definition)"
    return None


def _step_backend() -> tuple[Any, Optional[str]]:
    """The step's attention backend (its decode one where the runner has two) and its class name."""
    runner = STEP.context.get("runner")
    backend = getattr(runner, "decode_attn_backend", None) or getattr(runner, "attn_backend", None)
    return backend, type(backend).__name__ if backend is not None else None


def _bidirectional_runs_causal(backend: Any, name: Optional[str]) -> bool:
    if name not in BIDIRECTIONAL_CAUSAL_BACKENDS:
        return False
    # the triton backend says whether it lets them attend both ways (an absent flag: it may)
    return name != "TritonAttnBackend" or getattr(backend, "allow_bidirectional_attention_in_extend", None) is False


def _backend_reading_problem(layer: Any) -> Optional[str]:
    """What the step's backend makes of a layer's ``use_irope`` and of a bidirectional decoder, where
    the Definitions do not say it: both are recorded as the causal attention over every key that
    SGLang's ``triton`` and ``torch_native`` backends run for them (Llama-4's chunked layers attend
    over the whole sequence there, not per chunk); on another backend, or a ``triton`` one that
    allows bidirectional extends, they are listed. None where no runner is known yet (a CUDA
    graph's capture: each replay judges)."""
    if STEP.context.get("runner") is None:
        return None
    backend, name = _step_backend()
    which = f"SGLang's {name}" if name else "an attention backend the runner does not name"
    found = []
    if getattr(layer, "use_irope", False) and name not in IROPE_UNCHUNKED_BACKENDS:
        found.append(f"use_irope=True (Llama-4's chunked attention) on {which}, which may attend by chunks")
    if _attention_type(layer) == "decoder_bidirectional" and not _bidirectional_runs_causal(backend, name):
        found.append(f"attention type decoder_bidirectional on {which}, which may attend to later tokens in a prefill")
    if not found:
        return None
    return f"RadixAttention with {' and '.join(found)} (no Definition says what it ran)"


def decode_variant(kind: attention.Variant) -> attention.Variant:
    """What a windowed layer's decode attends on the step's backend. SGLang's ``triton`` backend
    decodes over each request's last ``min(seq_len, S)`` keys, S its runner's
    ``sliding_window_size`` (``update_sliding_window_buffer``): one key fewer than its extend's
    mask (``q - k <= S``) and its ``torch_native`` backend (``k >= q - S``) attend, so its decode's
    window is S keys (gpt-oss: 127 of HF's 128), recorded so."""
    if kind.window is None:
        return kind
    backend, name = _step_backend()
    if name != "TritonAttnBackend":
        return kind
    size = getattr(backend, "sliding_window_size", None)
    if size is None or int(size) < 1:
        require(f"a sliding window on SGLang's {name}, which does not say how many keys its decode reads "
                "(sliding_window_size)")
    return dataclasses.replace(kind, window=int(size))


def _stage_calls(decode: Any, prefill: Any, *shape: Any) -> list[KernelCall]:
    """A layer's calls in a step, its decode part with the variant its backend decodes (the shape's
    last item, :func:`decode_variant`), its prefill part with the layer's own."""
    *common, kind, decoded = shape
    return attention.layer_calls(decode, None, *common, decoded) + attention.layer_calls(None, prefill, *common, kind)


def _variant_problem(kind: attention.Variant) -> Optional[str]:
    """A part of the layer's variant that the step's attention backend does not compute."""
    parts = [part for part, on in (("window", kind.window is not None), ("soft_cap", kind.soft_cap is not None),
                                   ("sinks", kind.sinks)) if on]
    if not parts:
        return None
    _, name = _step_backend()
    missing = [part for part in parts if part not in VARIANT_BACKENDS.get(name, ())]
    if not missing:
        return None
    return (f"RadixAttention with {' and '.join(missing)} ({kind.suffix()[1:]}) on "
            f"{'SGLang' + chr(39) + 's ' + name if name else 'an attention backend the runner does not name'}, "
            "which does not compute it as its Definition does (no Definition says what it ran)")


def _cache_dtype() -> Any:
    """The step's KV pool's dtype (the model runner's ``token_to_kv_pool``), "unknown" where the
    runner does not say, None where no runner is known (a CUDA graph's capture: each replay judges)."""
    runner = STEP.context.get("runner")
    if runner is None:
        return None
    cached = getattr(getattr(runner, "token_to_kv_pool", None), "dtype", None)
    return "unknown" if cached is None else schema_dtype(cached)


def cache_problem(dtype: Any) -> Optional[str]:
    """Why the step's KV cache is neither of the queries' ``dtype`` nor FP8 e4m3 (``kv_cache_dtype=
    fp8_e4m3``, the ``*_kv_fp8`` Definitions), or None. Where the runner does not say (another
    SGLang), that is the problem: an FP8 cache must never pass for the queries' dtype."""
    cached = _cache_dtype()
    if cached is None or cached == dtype or cached is DType.float8_e4m3fn:
        return None
    if cached == "unknown":
        return "RadixAttention whose KV cache's dtype this SGLang's model runner does not say (token_to_kv_pool.dtype)"
    return (f"RadixAttention with a KV cache of {getattr(cached, 'value', cached)} for {getattr(dtype, 'value', dtype)} "
            "queries (no Definition computes it)")


#: SGLang's attention backends whose reading of an FP8 cache the Definitions compute: its Triton
#: backend (the decode's grouped kernel casts the queries to the cache's FP8, unscaled, and its
#: probabilities too; with one query head per KV head the queries stay in the model's dtype)
FP8_CACHE_BACKENDS = ("TritonAttnBackend",)


def _backend_problem() -> Optional[str]:
    """Why the step's attention backend is not one whose FP8-cache attention a Definition computes."""
    _, name = _step_backend()
    if name in FP8_CACHE_BACKENDS:
        return None
    which = f"SGLang's {name}" if name else "an attention backend the runner does not name"
    return f"an FP8 KV cache read by {which} (how it reads the cache and the queries is not known here: no Definition)"


def cache_scales(layer: Any) -> Optional[tuple[float, float]]:
    """An FP8 cache's (k_scale, v_scale) as SGLang uses the layer's: its checkpoint's, else 1.0
    (SGLang then stores the values unscaled and reads them back so); None for a cache of the
    queries' dtype. An FP8 cache is read so by SGLang's Triton backend only (the error names
    another)."""
    if _cache_dtype() is not DType.float8_e4m3fn:
        return None
    require(_backend_problem())
    if getattr(layer, "k_scale", None) is None or getattr(layer, "v_scale", None) is None:
        return (1.0, 1.0)
    return (float(layer.k_scale_float), float(layer.v_scale_float))


def _attended_scales(batch: Any, scales: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
    """The scales of the cache the step's attention reads: a decode step reads every key and value
    from the FP8 cache; an extend step attends its new tokens' keys and values as they are, in the
    model's dtype (the cache is read for a cached prefix only, which no Definition mixes with
    them: an error naming it), so it is the unquantized computation."""
    if scales is None or not batch.forward_mode.is_extend():
        return scales
    for part in STEP.batches(batch, step_batches):
        if part is None:
            continue
        kv_lens, q_lens = part.kv_indptr.diff(), part.qo_indptr.diff()  # page size 1: pages are tokens
        if bool((kv_lens > q_lens).any()):
            raise NotImplementedError(
                "RadixAttention over an FP8 KV cache in an extend step with a cached prefix (SGLang attends the new "
                "tokens' keys and values in the model's dtype and the prefix from the FP8 cache: no Definition "
                "computes it)")
    return None


def query_scale(num_q_heads: int, num_kv_heads: int, reads_fp8: bool) -> Optional[float]:
    """The scale of the queries where SGLang's Triton decode reads an FP8 cache (``reads_fp8``)
    with FP8 queries: its grouped kernel (query heads sharing a KV head, MLA's too) casts them to
    the cache's FP8 unscaled (1.0: the ``*_q_fp8_kv_fp8`` Definitions); its kernel for one query
    head per KV head keeps them in the model's dtype (None)."""
    return 1.0 if reads_fp8 and num_q_heads != num_kv_heads else None


def cache_slots(batch: Any) -> torch.Tensor:
    """The cache slots of the step's new tokens (``out_cache_loc``; page size 1)."""
    slots = getattr(batch, "out_cache_loc", None)
    if slots is None:
        raise RuntimeError("the step's cache slots (out_cache_loc) are unknown")
    return slots


def _cache_write(batch: Any, kv_heads: int, head_dim: int, dtype: Any,
                 scales: Optional[tuple[float, float]]) -> list[KernelCall]:
    """The layer's KV-cache write (``set_kv_buffer``): the step's new tokens at their cache slots
    (divided by ``scales`` into an FP8 cache)."""
    slots = cache_slots(batch)
    return [kv_cache.call(int(slots.shape[0]), kv_heads, head_dim, 1, RECORDER.num_pages or 0, dtype,
                          kv_cache.slots(slots), scales)]


def layer_calls(self: Any, q: torch.Tensor, forward_batch: Any, k: Optional[torch.Tensor] = None,
                save_kv_cache: bool = True, **extra: Any) -> list[KernelCall]:
    """``RadixAttention.forward``: the KV-cache write (where the layer saves its new keys and
    values), then the attention, as they run; ``extra``: the keyword arguments its model passed
    beyond the forward's own (``sinks``)."""
    seen(self)
    dtype = schema_dtype(q.dtype)
    kind = variant(self, extra.get("sinks"))
    require(judged_once(self, layer_problem) or _keyword_problem(extra) or _backend_reading_problem(self)
            or _variant_problem(kind) or cache_problem(dtype))
    STEP.batches(forward_batch, step_batches)
    scales = cache_scales(self)
    attended = _attended_scales(forward_batch, scales)
    writes = _cache_write(forward_batch, self.tp_k_head_num, self.head_dim, dtype, scales) \
        if k is not None and save_kv_cache else []
    return writes + STEP.calls((self.tp_q_head_num, self.tp_k_head_num, self.head_dim, 1, RECORDER.num_pages or 0,
                                dtype, float(self.scaling), attended,
                                query_scale(self.tp_q_head_num, self.tp_k_head_num, attended is not None), kind,
                                decode_variant(kind)), _stage_calls)


def captured_layer_calls(self: Any, q: torch.Tensor, k: Optional[torch.Tensor] = None,
                         save_kv_cache: bool = True, **extra: Any) -> Callable[[], list[KernelCall]]:
    """While a CUDA graph captures an attention layer: its shape, and how to build its calls in
    each step that replays the graph, from that step's batch (the replay runs no Python layer)."""
    seen(self)
    kind = variant(self, extra.get("sinks"))
    require(layer_problem(self) or _keyword_problem(extra))
    return functools.partial(_calls_in_graph, (self.tp_q_head_num, self.tp_k_head_num, self.head_dim,
                                               schema_dtype(q.dtype), float(self.scaling), self, kind),
                             k is not None and save_kv_cache)


def _calls_in_graph(layer: tuple, writes: bool = False) -> list[KernelCall]:
    batch = STEP.context.get("batch")
    if batch is None:
        raise RuntimeError("a CUDA graph replayed outside a model step: its attention layout is unknown")
    STEP.batches(batch, step_batches)
    heads, kv_heads, head_dim, dtype, scale, attention_layer, kind = layer
    require(cache_problem(dtype) or _backend_reading_problem(attention_layer) or _variant_problem(kind))
    scales = cache_scales(attention_layer)  # judged at each replay: the runner says the cache's dtype
    written = _cache_write(batch, kv_heads, head_dim, dtype, scales) if writes else []
    attended = _attended_scales(batch, scales)
    return written + STEP.calls((heads, kv_heads, head_dim, 1, RECORDER.num_pages or 0, dtype, scale, attended,
                                 query_scale(heads, kv_heads, attended is not None), kind, decode_variant(kind)),
                                _stage_calls)
