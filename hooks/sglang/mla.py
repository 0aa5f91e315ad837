"""SGLang's DeepSeek MLA attention (``DeepseekV2AttentionMLA``) as the ``mla`` family's calls.

The layer holds two ``RadixAttention`` layers and picks one per step (its backend's dispatch):

- ``forward_absorb_core``: the absorbed form against the latent cache (``attn_mqa``: decode, and
  prefill where the backend chooses it); W_UK was folded into the queries just before (a
  ``torch.bmm``, recorded here, after the RoPE that ran between), the layer's new latents are
  written to the cache by the attention backend, W_UV is applied after (``torch.bmm``);
- ``forward_normal_core``: the up-projected form over the step's new tokens (``attn_mha``: ragged
  q/k of ``qk_nope + qk_rope``, v of ``v_head_dim``), the latents written before it by
  ``_set_mla_kv_buffer`` (hooked on its own). A prefill whose requests attend to cached context in
  this form (SGLang's one-shot / chunked-KV paths) has no Definition and is reported so.

Both ``RadixAttention`` layers are this layer's (:data:`LAYER_RULE` covers them); their own hook
runs nested in these and records nothing. The step's layout is the attention hooks'
(:mod:`.attention`: page size 1, the request-to-token table's rows are the page ids).

An FP8 latent cache (``kv_cache_dtype=fp8_e4m3``, judged by the pool at each step): the writes
cast to FP8 (``*_kv_fp8``), the absorbed decode reads it with the query latent cast to FP8 as
SGLang's Triton decode does (``*_q_fp8_kv_fp8``), the up-projected prefill attends its new tokens
unquantized.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import LayerRule, require, seen
from fi_profile.capture.paged_layout import paged_batches
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import attention as attention_family
from fi_profile.families import kv_cache, mla
from fi_profile.families.attention.step import Batches
from fi_profile.hooks.sglang import attention
from fi_profile.hooks.sglang.attention import STEP
from fi_profile.schema.dtype import schema_dtype

COVERED_CLASS = "DeepseekV2AttentionMLA"
#: KV-cache dtypes whose latent cache the Definitions compute: the model's own, and FP8 e4m3 (judged
#: at each step by the pool SGLang allocated, :func:`latent_cache_scale`)
_KNOWN_CACHE = ("auto", "bfloat16", "float16", "float32", "fp8_e4m3")


def layer_problem(layer: Any) -> Optional[str]:
    """Why a DeepSeek MLA layer is not the dense latent attention the Definitions compute, or None."""
    kv_cache_dtype = str(getattr(layer, "kv_cache_dtype", "auto") or "auto")
    w_kc = getattr(layer, "w_kc", None)
    dcp = int(getattr(layer, "dcp_size", 1) or 1)
    kv_b_proj = getattr(layer, "kv_b_proj", None)
    return attention_family.layer_problem(layer, COVERED_CLASS, {
        f"KV cache {kv_cache_dtype}": kv_cache_dtype not in _KNOWN_CACHE,
        "sparse attention (a DSA indexer's top-k tokens)": bool(getattr(layer, "use_dsa", False)),
        f"decode context parallel ({dcp} ranks)": dcp > 1,
        f"absorbed weights in {getattr(w_kc, 'dtype', None)}":
            w_kc is not None and w_kc.dtype not in (torch.bfloat16, torch.float16, torch.float32),
        "DeepGEMM batched GEMMs": bool(getattr(layer, "use_deep_gemm_bmm", False)),
        "LoRA on kv_b_proj": bool(getattr(kv_b_proj, "set_lora", False)),
        "GGUF split kv_b weights": bool(getattr(layer, "_kimi_split_gguf_kv_b", False)),
        "attention sinks": getattr(layer, "learnable_sink_param", None) is not None,
        "no rotary embedding": getattr(layer, "rotary_emb", None) is None,
    })


def _attention_layers(layer: Any) -> tuple:
    return tuple(getattr(layer, name, None) for name in ("attn_mqa", "attn_mha", "attn_mqa_for_dcp_decode"))


#: the MLA layer is judged itself; its two attention layers are recorded by its hooks here, its
#: projections, norms and RoPE by their own
LAYER_RULE = LayerRule(f"sglang.srt.models.deepseek_v2:{COVERED_CLASS}", layer_problem, container=True,
                       records=_attention_layers)


def latent_cache_scale(layer: Any, dtype: Any) -> Optional[float]:
    """The scale of the step's FP8 latent cache (SGLang's pool of ``float8_e4m3fn``), None for a
    cache of the model's dtype. SGLang's pool casts each latent to FP8 unscaled where the layer
    keeps no scale or a scale of 1.0 (an FP8 checkpoint without KV scales): 1.0. With another
    scale its prefill writes the latents unscaled while its decode divides them, which no
    Definition computes. Only its Triton backend's reading is known (the error names another)."""
    require(attention.cache_problem(dtype))
    scales = attention.cache_scales(layer.attn_mqa)
    if scales is None:
        return None
    if scales != (1.0, 1.0):
        raise NotImplementedError(
            f"SGLang's FP8 latent cache with the checkpoint's scales (k_scale {scales[0]}, v_scale {scales[1]}: its "
            "prefill writes the latents unscaled, its decode divides them by k_scale): no Definition")
    return 1.0


def _shape(layer: Any, dtype: torch.dtype) -> mla.MlaShape:
    """The layer's shape in this step, its latent cache's FP8 scale with it: SGLang's Triton decode
    then casts the query latent to FP8 too (:func:`attention.query_scale`)."""
    heads, cache_scale = int(layer.num_local_heads), latent_cache_scale(layer, schema_dtype(dtype))
    return mla.MlaShape(num_heads=heads, kv_lora_rank=int(layer.kv_lora_rank),
                        qk_rope_head_dim=int(layer.qk_rope_head_dim), qk_nope_head_dim=int(layer.qk_nope_head_dim),
                        v_head_dim=int(layer.v_head_dim), dtype=schema_dtype(dtype), sm_scale=float(layer.scaling),
                        cache_scale=cache_scale, query_scale=attention.query_scale(heads, 1, cache_scale is not None))


def _latent_write(batch: Any, shape: mla.MlaShape) -> KernelCall:
    slots = attention.cache_slots(batch)
    return kv_cache.mla_call(int(slots.shape[0]), shape.kv_lora_rank, shape.qk_rope_head_dim, 1,
                             RECORDER.num_pages or 0, shape.dtype, kv_cache.slots(slots), shape.cache_scale)


# -- absorbed ------------------------------------------------------------------------------------


def _absorbed(batch: Any, shape: mla.MlaShape) -> list[KernelCall]:
    if shape.cache_scale is not None and batch.forward_mode.is_extend():
        raise NotImplementedError(
            "an absorbed MLA extend step over SGLang's FP8 latent cache (its new tokens in the model's dtype beside a "
            "cached FP8 prefix): no Definition")
    STEP.batches(batch, attention.step_batches)
    calls = STEP.calls((shape, 1, RECORDER.num_pages or 0), mla.absorbed_calls)
    if not calls:
        return []
    return [calls[0], _latent_write(batch, shape), *calls[1:]]


def _check_absorbed(self: Any, fusion_plan: Any, llama_4_scaling: Any) -> None:
    seen(self, self.attn_mqa, self.kv_b_proj)  # kv_b_proj's weights are W_UK and W_UV here
    require(layer_problem(self))
    if fusion_plan is not None:
        raise NotImplementedError("SGLang fused W_UK's batched GEMM into the MLA attention kernel: no Definition")
    if llama_4_scaling is not None:
        raise NotImplementedError("MLA queries scaled by position (llama_4_scaling): no Definition")


def absorbed_calls(self: Any, q_nope_out: torch.Tensor, forward_batch: Any, fusion_plan: Any = None,
                   llama_4_scaling: Any = None) -> list[KernelCall]:
    """``forward_absorb_core`` (eager): W_UK's batched GEMM, the latent write, the paged attention
    of the step's decode and prefill requests, W_UV's batched GEMM."""
    _check_absorbed(self, fusion_plan, llama_4_scaling)
    return _absorbed(forward_batch, _shape(self, q_nope_out.dtype))


def captured_absorbed_calls(self: Any, q_nope_out: torch.Tensor, fusion_plan: Any = None,
                            llama_4_scaling: Any = None) -> Callable[[], list[KernelCall]]:
    """While a CUDA graph captures ``forward_absorb_core``: the layer's shape, and how to build its
    calls from each replaying step's batch."""
    _check_absorbed(self, fusion_plan, llama_4_scaling)
    _shape(self, q_nope_out.dtype)  # a layer no Definition computes fails while the graph captures (again at each replay)
    return functools.partial(_in_graph, _absorbed, self, q_nope_out.dtype)


# -- up-projected (ragged) -----------------------------------------------------------------------


def _ragged(batch: Any, shape: mla.MlaShape) -> list[KernelCall]:
    """The step's requests' new tokens as one ragged causal prefill (every request: a prompt with
    nothing cached, so its query is its whole sequence)."""
    if any(int(n) for n in (getattr(batch, "extend_prefix_lens_cpu", None) or ())):
        raise NotImplementedError(
            "an up-projected MLA prefill attended to cached context (SGLang's one-shot or chunked-KV path): "
            "no Definition; not in the record")
    STEP.batches(batch, _ragged_layout)  # once per step, for all its layers
    return STEP.calls((shape,), _ragged_prefill)


def _ragged_layout(batch: Any) -> Batches:
    """Every request of the step as a prefill (a one-token prompt too: nothing is decoded here)."""
    layout = attention.step_layout(batch)
    if layout is None:
        return None, None
    return None, paged_batches(*layout, attention.request_pages(batch), 1, decode_max_query=0)[1]


def _ragged_prefill(decode: Any, requests: Any, shape: mla.MlaShape) -> list[KernelCall]:
    return [mla.ragged_prefill_call(requests, shape)] if requests is not None else []


def ragged_calls(self: Any, q: torch.Tensor, forward_batch: Any) -> list[KernelCall]:
    """``forward_normal_core`` (eager): the up-projected causal prefill of the step's new tokens."""
    seen(self, self.attn_mha, self.kv_b_proj)
    require(layer_problem(self))
    return _ragged(forward_batch, _shape(self, q.dtype))


def captured_ragged_calls(self: Any, q: torch.Tensor) -> Callable[[], list[KernelCall]]:
    seen(self, self.attn_mha, self.kv_b_proj)
    require(layer_problem(self))
    _shape(self, q.dtype)
    return functools.partial(_in_graph, _ragged, self, q.dtype)


def ragged_prologue_calls(self: Any, k_nope: torch.Tensor, forward_batch: Any) -> list[KernelCall]:
    """``_concat_and_cast_mha_k``, before the up-projected prefill and outside its hooked call: the
    keys' concatenation of ``k_nope`` and the rotary keys SGLang launches for it (``concat_mla_k``),
    accounted to that prefill, as vLLM's, inside its MLA call, is (nothing recorded here)."""
    require(layer_problem(self))
    return _ragged(forward_batch, _shape(self, k_nope.dtype))


def latent_write_calls(self: Any, kv_a: torch.Tensor, forward_batch: Any) -> list[KernelCall]:
    """``_set_mla_kv_buffer`` (before the up-projected prefill): the new tokens' latents and rotary
    keys written to the latent cache."""
    require(layer_problem(self))
    return [_latent_write(forward_batch, _shape(self, kv_a.dtype))]


def captured_latent_write_calls(self: Any, kv_a: torch.Tensor) -> Callable[[], list[KernelCall]]:
    require(layer_problem(self))
    _shape(self, kv_a.dtype)
    return functools.partial(_in_graph, lambda batch, shape: [_latent_write(batch, shape)], self, kv_a.dtype)


def _in_graph(make: Callable[[Any, mla.MlaShape], list[KernelCall]], layer: Any, dtype: torch.dtype) -> list[KernelCall]:
    """A replaying step's calls of a layer a CUDA graph captured: its shape judged now (the step's
    runner says its latent cache's dtype; none is known while the graph captures)."""
    batch = STEP.context.get("batch")
    if batch is None:
        raise RuntimeError("a CUDA graph replayed outside a model step: its MLA layout is unknown")
    return make(batch, _shape(layer, dtype))
