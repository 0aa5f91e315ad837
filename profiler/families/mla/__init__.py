"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) as the engines run it: decode against the
latent cache in the absorbed form (op type ``mla_paged``: ``q_nope`` of the latent width, ``q_pe``,
the cache split into its latent part ``ckv`` and rotary part ``kpe``), and prefill of new tokens in
the up-projected form over ragged (contiguous per request) q / k / v (``mla_ragged``: q and k of
``qk_nope + qk_rope``, v of ``v_head_dim``). flashinfer-trace's Definitions and interfaces.

Each engine reads its layers' metadata into the step's :class:`~fi_profile.capture.paged_layout.PagedBatch`
layout (``hooks/<engine>/mla.py``); the calls of a step's layers of one shape are built here, once.
The projections around the attention (the absorbed per-head batched GEMMs) are the ``bmm`` family's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix
from fi_profile.capture.paged_layout import PagedBatch
from fi_profile.families import attention, bmm
from fi_profile.families.attention import FP8_QUERY
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.families.kv_cache import FP8_CACHE, MLA_CACHES, fp8_dtypes, fp8_latent_cache_scalars
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType

KEY = "mla"


@dataclass(frozen=True)
class MlaShape:
    """One MLA layer's shape on this rank: query heads, the latent (``kv_lora_rank``) and rotary
    widths, the up-projected query/key nope width and value width, and its softmax scale."""

    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    dtype: DType
    sm_scale: float
    #: the one scale of an FP8 (e4m3) latent cache, which the decode reads dequantized (None: the
    #: cache holds ``dtype``)
    cache_scale: Optional[float] = None
    #: the scale of the query latent (``q_nope``) where the decode takes it in FP8 e4m3 too (SGLang's
    #: Triton decode casts it to the cache's FP8 unscaled: 1.0); None: it stays ``dtype``
    query_scale: Optional[float] = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


#: the FP8 forms the paged decode has a Definition of: (page size class, FP8 query latent) -> its
#: template (vLLM's Triton MLA: bf16 queries on pages of tokens; SGLang's Triton decode: the query
#: latent cast to FP8 on its token-granular cache)
_FP8_DECODE = {(64, False): "mla_paged_decode_h16_ckv512_kpe64_ps64" + FP8_CACHE,
               (1, True): "mla_paged_decode_h16_ckv512_kpe64_ps1" + FP8_QUERY + FP8_CACHE}


def _template(kind: str, shape: MlaShape, page_size: int) -> str:
    ps = 1 if page_size == 1 else 64
    fp8, fp8_q = shape.cache_scale is not None, shape.query_scale is not None
    if not fp8 and not fp8_q:
        return f"mla_paged_{kind}_h16_ckv512_kpe64_ps{ps}"
    template = _FP8_DECODE.get((ps, fp8_q)) if fp8 and kind == "decode" else None
    if template is None:
        queries = "FP8" if fp8_q else "bf16"
        cache = "an FP8" if fp8 else f"a {shape.dtype.value}"
        raise NotImplementedError(f"MLA {kind.replace('_', ' ')} of {queries} queries over {cache} latent cache of "
                                  f"{page_size}-token pages: no Definition")
    return template


def paged_call(batch: PagedBatch, stage: str, shape: MlaShape, page_size: int, num_pages: int) -> KernelCall:
    """Attention of ``batch``'s queries (one per request in decode) against the paged latent cache,
    in the absorbed form."""
    kind = "decode" if stage == "decode" else "prefill_causal"
    template = _template(kind, shape, page_size)
    fp8, fp8_q = shape.cache_scale is not None, shape.query_scale is not None

    def build() -> Definition:
        consts = {"num_qo_heads": shape.num_heads, "head_dim_ckv": shape.kv_lora_rank,
                  "head_dim_kpe": shape.qk_rope_head_dim, "page_size": page_size}
        quantized = (FP8_QUERY if fp8_q else "") + (FP8_CACHE if fp8 else "")
        name = (f"mla_paged_{kind}_h{shape.num_heads}_ckv{shape.kv_lora_rank}_kpe{shape.qk_rope_head_dim}"
                f"_ps{page_size}{dtype_suffix(shape.dtype)}{quantized}")
        return definition_for(template, name, consts, shape.dtype,
                              input_dtypes={**fp8_dtypes(MLA_CACHES, fp8), **fp8_dtypes(("q_nope",), fp8_q)})

    definition = cached_definition(("mla_paged", stage, shape.num_heads, shape.kv_lora_rank, shape.qk_rope_head_dim,
                                    page_size, shape.dtype, fp8, fp8_q), build)
    axes = {"len_indptr": batch.batch_size + 1}
    if "batch_size" in definition.var_axes:
        axes["batch_size"] = batch.batch_size
    if "total_q" in definition.var_axes:
        axes["total_q"] = batch.total_q
    axes.update(num_kv_indices=int(batch.kv_indptr[-1]), num_pages=num_pages)
    tensors: dict[str, Any] = {"kv_indptr": batch.kv_indptr, "kv_indices": batch.gather_kv_indices}
    if "qo_indptr" in definition.inputs:
        tensors["qo_indptr"] = batch.qo_indptr
    if "kv_last_page_len" in definition.inputs:
        tensors["kv_last_page_len"] = batch.kv_last_page_len
    scalars = {"sm_scale": shape.sm_scale, **fp8_latent_cache_scalars(shape.cache_scale)}
    if fp8_q:
        scalars.update(q_nope_scale=float(shape.query_scale))
    return KernelCall(definition, axes, tensors, scalars)


def ragged_prefill_call(batch: PagedBatch, shape: MlaShape) -> KernelCall:
    """Causal attention of ``batch``'s new tokens among themselves, up-projected (every head its own
    key and value): a prefill with no cached context."""

    def build() -> Definition:
        consts = {"num_qo_heads": shape.num_heads, "num_kv_heads": shape.num_heads, "qk_dim": shape.qk_head_dim,
                  "vo_dim": shape.v_head_dim}
        name = (f"mla_ragged_prefill_causal_h{shape.num_heads}_qk{shape.qk_head_dim}_vo{shape.v_head_dim}"
                f"{dtype_suffix(shape.dtype)}")
        return definition_for("mla_ragged_prefill_causal_h16_qk192_vo128", name, consts, shape.dtype)

    definition = cached_definition(("mla_ragged", shape.num_heads, shape.qk_head_dim, shape.v_head_dim, shape.dtype),
                                   build)
    axes = {"len_indptr": batch.batch_size + 1, "total_q": batch.total_q, "total_kv": batch.total_q}
    tensors = {"qo_indptr": batch.qo_indptr, "kv_indptr": batch.qo_indptr}
    return KernelCall(definition, axes, tensors, {"sm_scale": shape.sm_scale})


def context_tokens(batch: PagedBatch, page_size: int) -> int:
    """The cached tokens ``batch``'s requests attend to beyond their new ones (a prompt's earlier
    chunks under chunked prefill, a prefix-cache hit)."""
    pages = (batch.kv_indptr[1:] - batch.kv_indptr[:-1]).long()
    kv_tokens = (pages - 1) * page_size + batch.kv_last_page_len.long()
    q_tokens = (batch.qo_indptr[1:] - batch.qo_indptr[:-1]).long()
    return int((kv_tokens - q_tokens).sum())


def layer_calls(decode: Optional[PagedBatch], prefill: Optional[PagedBatch], shape: MlaShape, page_size: int,
                num_pages: int) -> list[KernelCall]:
    """One MLA layer's attention in a step, in the order the engines run it: its prefill requests'
    new tokens ragged (up-projected), then its decode requests against the latent cache (absorbed),
    between the two batched GEMMs that absorb W_UK into the queries and apply W_UV to the latent
    output. Decode requests of more than one query token (a backend that runs short prefills or
    speculative tokens as decodes) are the absorbed paged prefill."""
    calls = [ragged_prefill_call(prefill, shape)] if prefill is not None else []
    return calls + absorbed_calls(decode, None, shape, page_size, num_pages)


def absorbed_calls(decode: Optional[PagedBatch], prefill: Optional[PagedBatch], shape: MlaShape, page_size: int,
                   num_pages: int) -> list[KernelCall]:
    """A step's queries against the latent cache in the absorbed form, its decode requests and its
    prefill requests (SGLang runs both so): W_UK folded into all their queries (a batched GEMM per
    head), the paged attention of each part (decode where every request has one query token, the
    causal paged prefill otherwise), W_UV applied to the latent output."""
    parts = [batch for batch in (decode, prefill) if batch is not None]
    if not parts:
        return []
    tokens = sum(batch.total_q for batch in parts)
    paged = [paged_call(batch, "decode" if batch.total_q == batch.batch_size else "prefill", shape, page_size,
                            num_pages) for batch in parts]
    return [bmm.call(shape.num_heads, tokens, shape.kv_lora_rank, shape.qk_nope_head_dim, shape.dtype), *paged,
            bmm.call(shape.num_heads, tokens, shape.v_head_dim, shape.kv_lora_rank, shape.dtype)]


#: vLLM's Triton MLA decode kernel (its TRITON_MLA backend); its FlashAttention (the MLA prefill's
#: default on Hopper)
_VLLM_TRITON = "vllm.v1.attention.ops.triton_decode_attention"
_VLLM_FLASH_ATTN = "vllm.vllm_flash_attn.flash_attn_interface"
#: SGLang's Triton decode and extend kernels (its ``triton`` backend, on its token-granular cache)
_SGLANG_TRITON = "sglang.kernels.ops.attention.extend_attention"


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    # the engines' kernels leave their log-sum-exp as scratch: ``output`` only
    sglang = Native("sglang", "sglang_triton_mla_ragged.py" if definition.op_type == "mla_ragged"
                    else "sglang_triton_mla.py", must_fit=True, requires=_SGLANG_TRITON, label="sglang_triton",
                    computes=("output",))
    if definition.op_type == "mla_ragged":
        return [Native("flashinfer", "flashinfer_mla_ragged.py", must_fit=True),
                Native("vllm", "vllm_flash_attn_mla_ragged.py", must_fit=True, requires=_VLLM_FLASH_ATTN,
                       label="vllm_flash_attn", computes=("output",)), sglang]
    natives = [Native("flashinfer", "flashinfer_mla_paged.py", must_fit=True)]
    # vLLM's runs decode only (its ``run`` takes no qo_indptr), of bf16 queries
    if "qo_indptr" not in definition.inputs and not _fp8_queries(definition):
        natives.append(Native("vllm", "vllm_triton_mla.py", must_fit=True, requires=_VLLM_TRITON,
                              label="vllm_triton", computes=("output",)))
    return natives + ([sglang] if definition.const_axes.get("page_size") == 1 else [])


def _fp8_queries(definition: Definition) -> bool:
    return attention.fp8_input(definition, "q_nope")


def _rounds_through(definition: Definition) -> Optional[torch.dtype]:
    """With an FP8 query latent, SGLang's Triton decode multiplies FP8 probabilities with the FP8
    latent values (it casts them to the cache's dtype), which the reference keeps in float32: FP8's
    precision bounds the check."""
    return torch.float8_e4m3fn if _fp8_queries(definition) else None


def _engine_kernel(run: EngineRun, definition: Definition) -> EngineKernel:
    backend, framework = run.attention_backend.upper(), run.framework.lower()
    decode = definition.op_type == "mla_paged" and "qo_indptr" not in definition.inputs
    if framework == "vllm" and backend == "TRITON_MLA" and decode:
        return EngineKernel("vllm_triton", "vLLM's TRITON_MLA backend (its Triton decode kernel)")
    if framework == "vllm" and backend == "FLASHINFER_MLA" and definition.op_type == "mla_paged":
        return EngineKernel("flashinfer", "vLLM's FLASHINFER_MLA backend")
    if framework == "vllm" and definition.op_type == "mla_ragged":
        return EngineKernel("vllm_flash_attn", "vLLM's default MLA prefill backend on Hopper (vllm_flash_attn's "
                                               "FlashAttention; another attention_config.mla_prefill_backend is not "
                                               "in the record)")
    if framework == "sglang" and backend == "TRITON" and (definition.op_type == "mla_ragged"
                                                          or definition.const_axes.get("page_size") == 1):
        return EngineKernel("sglang_triton", "SGLang's triton attention backend (its decode and extend kernels)")
    return EngineKernel(None, f"the {run.attention_backend} MLA backend, which the replay has no solution of")


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("mla_paged", "mla_ragged"),
    templates=("mla_paged_decode_h16_ckv512_kpe64_ps1", "mla_paged_decode_h16_ckv512_kpe64_ps64",
               *_FP8_DECODE.values(),
               "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1", "mla_paged_prefill_causal_h16_ckv512_kpe64_ps64",
               "mla_ragged_prefill_causal_h16_qk192_vo128"),
    baselines=(Baseline("torch_mla_paged.py", compiled=False, op_type="mla_paged"),
               Baseline("torch_mla_ragged.py", compiled=False, op_type="mla_ragged")),
    natives=_natives,
    engine_kernel=_engine_kernel,
    kernel_words=attention.KERNEL_WORDS,
    tail_words=("memcpy",),  # vLLM's MLA op copies its output into the layer's output buffer
    rounds_through=_rounds_through,
)
