"""Grouped-query attention over a paged KV cache (decode, and causal prefill), as the engines'
attention layers run it; flashinfer-trace's ragged prefill too (replay only). Op types
``gqa_paged`` and ``gqa_ragged``. Each engine reads its layers' metadata into a step's
:class:`~fi_profile.capture.paged_layout.PagedBatch` layout (``hooks/<engine>/attention.py``);
the calls of every layer of a step are built here, once per shape (:mod:`.step`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix
from fi_profile.capture.paged_layout import PagedBatch
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.families.kv_cache import FP8_CACHE, GQA_CACHES, fp8_cache_scalars, fp8_dtypes
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType
from fi_profile.schema.reference import reference_constant

KEY = "attention"
#: the name part of Definitions whose queries come quantized to FP8 (over an FP8 cache)
FP8_QUERY = "_q_fp8"
#: the words attention kernels are named with, GQA's and MLA's alike (the engines' Triton decode
#: kernels serve both), so that the kernel accounting takes the two families' kernels as one's
KERNEL_WORDS = ("attention", "attn", "flash", "paged", "fwd", "stage1", "stage2", "reduce_segments", "decode_kernel",
                "mla", "softmax_reduce")


@dataclass(frozen=True)
class Variant:
    """What an attention layer computes beyond plain causal softmax attention, each part in the
    Definition's name (``_chunk{C}``, ``_swa{W}``, ``_cap{C}``, ``_sink``) and its reference
    (``ATTENTION_CHUNK``, ``WINDOW_LEFT``, ``LOGITS_SOFT_CAP``, the ``sinks`` input). Its softmax
    scale is the call's ``sm_scale`` whatever it is (Gemma's ``query_pre_attn_scalar``)."""

    #: each query attends its ``window`` latest keys, itself included (FlashInfer's ``window_left``
    #: is ``window - 1``; vLLM's ``sliding_window`` is ``window``, SGLang's ``sliding_window_size``
    #: ``window - 1``, except in its Triton decode: ``window``); None: every key
    window: Optional[int] = None
    #: the logits become ``soft_cap * tanh(logits / soft_cap)`` (Gemma-2's, Grok's); None: no cap
    soft_cap: Optional[float] = None
    #: one learned logit per query head joins every softmax, with a value of zero (gpt-oss)
    sinks: bool = False
    #: each query attends only the keys of its own chunk of ``chunk`` positions, causally (Llama-4's
    #: chunked local attention, ``attention_chunk_size``); None: no chunks
    chunk: Optional[int] = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"a sliding window of {self.window} keys")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"attention chunks of {self.chunk} positions")
        if self.soft_cap is not None and not self.soft_cap > 0:
            raise ValueError(f"a logit soft cap of {self.soft_cap}")

    @property
    def plain(self) -> bool:
        return self == PLAIN

    def suffix(self) -> str:
        cap = "" if self.soft_cap is None else f"_cap{self.soft_cap:g}".replace(".", "p")
        chunk = "" if self.chunk is None else f"_chunk{self.chunk}"
        return chunk + (f"_swa{self.window}" if self.window is not None else "") + cap + ("_sink" if self.sinks else "")

    def constants(self) -> dict[str, float]:
        """The variant templates' reference constants it sets (the chunk only where it has one: the
        chunked templates alone take it)."""
        chunk = {} if self.chunk is None else {CHUNK_CONSTANT: int(self.chunk)}
        return {"WINDOW_LEFT": -1 if self.window is None else self.window - 1,
                "LOGITS_SOFT_CAP": 0.0 if self.soft_cap is None else float(self.soft_cap), **chunk}


#: the chunked templates' reference constant of the chunk's length (0: no chunks)
CHUNK_CONSTANT = "ATTENTION_CHUNK"


PLAIN = Variant()
#: the reference constants a variant's Definition sets (a plain Definition sets none: its
#: baseline's defaults, no window and no cap, are then the plain op's)
VARIANT_CONSTANTS = tuple(PLAIN.constants())


def variant_template(kind: str, page_size: int, sinks: bool, chunked: bool = False) -> str:
    """The shipped Definition a variant's calls are instantiated from (gpt-oss-20b's sliding layers
    for those with sinks, Llama-4-Scout's chunked ones for chunked attention, Gemma-3-27B's sliding
    layers for the others)."""
    pages = f"ps{1 if page_size == 1 else 16}"
    if chunked:
        return f"gqa_paged_{kind}_h40_kv8_d128_{pages}_chunk8192"
    shape = "h64_kv8_d64" if sinks else "h32_kv16_d128"
    return f"gqa_paged_{kind}_{shape}_{pages}_swa{128 if sinks else 1024}{'_sink' if sinks else ''}"


def call(batch: PagedBatch, stage: str, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
         num_pages: int, dtype: DType, sm_scale: float, cache_scales: Optional[tuple[float, float]] = None,
         q_scale: Optional[float] = None, variant: Variant = PLAIN) -> KernelCall:
    """One stage's call; ``cache_scales``: (k_scale, v_scale) of an FP8 (e4m3) KV cache, whose
    Definitions (``*_kv_fp8``) take the caches in FP8 and dequantize them by those scales;
    ``q_scale``: the queries come quantized to FP8 by it too (``*_q_fp8_kv_fp8``); ``variant``: a
    window, soft cap or sinks (:class:`Variant`)."""
    fp8, fp8_q = cache_scales is not None, q_scale is not None
    if fp8_q and not fp8:
        raise NotImplementedError("FP8 queries over a KV cache that is not FP8: no Definition")
    if fp8 and not variant.plain:
        raise NotImplementedError(f"attention{variant.suffix()} over an FP8 KV cache: no Definition")
    if variant.chunk is not None and variant.sinks:
        raise NotImplementedError(f"attention{variant.suffix()}: chunked attention with sinks has no Definition")

    def build() -> Definition:
        consts = {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "page_size": page_size}
        quantized = (FP8_QUERY if fp8_q else "") + (FP8_CACHE if fp8 else "")
        shape = f"h{num_q_heads}_kv{num_kv_heads}_d{head_dim}_ps{page_size}{dtype_suffix(dtype)}{quantized}"
        kind = "decode" if stage == "decode" else "prefill_causal"
        if not variant.plain:
            return definition_for(variant_template(kind, page_size, variant.sinks, variant.chunk is not None),
                                  f"gqa_paged_{kind}_{shape}{variant.suffix()}", consts, dtype, variant.constants())
        template = f"gqa_paged_{kind}_h32_kv8_d128_ps{1 if page_size == 1 else 16}{quantized}"
        return definition_for(template, f"gqa_paged_{kind}_{shape}", consts, dtype,
                              input_dtypes={**fp8_dtypes(GQA_CACHES, fp8), **fp8_dtypes(("q",), fp8_q)})

    definition = cached_definition(("paged_attention", stage, num_q_heads, num_kv_heads, head_dim, page_size, dtype, fp8,
                                    fp8_q, variant), build)
    if stage == "decode":
        axes = {"batch_size": batch.batch_size, "len_indptr": batch.batch_size + 1}
    else:
        axes = {"len_indptr": batch.batch_size + 1, "total_q": batch.total_q}
        if "batch_size" in definition.var_axes:
            axes["batch_size"] = batch.batch_size
    axes.update(num_kv_indices=int(batch.kv_indptr[-1]), num_pages=num_pages)
    tensors: dict[str, Any] = {"kv_indptr": batch.kv_indptr, "kv_indices": batch.gather_kv_indices}  # gathered if kept
    if "qo_indptr" in definition.inputs:
        tensors["qo_indptr"] = batch.qo_indptr
    if "kv_last_page_len" in definition.inputs:
        tensors["kv_last_page_len"] = batch.kv_last_page_len
    scalars = {"sm_scale": sm_scale, **fp8_cache_scalars(cache_scales)}
    if fp8_q:
        scalars.update(q_scale=float(q_scale))
    return KernelCall(definition, axes, tensors, scalars)


def layer_calls(decode: Optional[PagedBatch], prefill: Optional[PagedBatch], *shape: Any) -> list[KernelCall]:
    """One attention layer's calls in a step: its decode part and its prefill part, where present."""
    parts = (("decode", decode), ("prefill", prefill))
    return [call(batch, stage, *shape) for stage, batch in parts if batch is not None]


def layer_problem(layer: Any, covered_class: Union[str, tuple[str, ...]], features: Mapping[str, bool]) -> Optional[str]:
    """Why an attention layer is not a paged GQA call the Definitions compute, or None: only the
    engine's ``covered_class`` (or classes) itself, without any of the ``features`` (what the
    engine's layer says it does beyond causal decoder self-attention: a window, a soft cap, MLA ...)
    that apply."""
    name = type(layer).__name__
    if name not in ((covered_class,) if isinstance(covered_class, str) else covered_class):
        return f"{name} (an attention layer class no Definition computes)"
    problems = [what for what, applies in features.items() if applies]
    return f"{name} with {', '.join(problems)} (no Definition computes it)" if problems else None


#: the engines' Triton attention kernels: vLLM's unified attention (its TRITON_ATTN backend), and
#: SGLang's decode and extend kernels (its ``triton`` backend, on its token-granular cache)
_VLLM_TRITON = "vllm.v1.attention.ops.triton_unified_attention"
_SGLANG_TRITON = "sglang.kernels.ops.attention.extend_attention"


def is_variant(definition: Definition) -> bool:
    """Whether a Definition computes more than plain causal attention: a window or soft cap its
    reference sets, or sinks among its inputs (:class:`Variant`)."""
    window, cap = (reference_constant(definition.reference, name) for name in VARIANT_CONSTANTS)
    return "sinks" in definition.inputs or (window is not None and float(window) >= 0) or \
        (cap is not None and float(cap) > 0) or chunked(definition)


def chunked(definition: Definition) -> bool:
    """Whether a Definition's queries attend only their own chunk (its reference's ``ATTENTION_CHUNK``)."""
    chunk = reference_constant(definition.reference, CHUNK_CONSTANT)
    return chunk is not None and float(chunk) > 0


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    kind = {"gqa_paged": "paged", "gqa_ragged": "ragged"}[definition.op_type]
    # vLLM's Triton kernel takes a window, a soft cap and sinks; the others are offered plain attention only
    vllm = Native("vllm", "vllm_triton_attention.py", must_fit=True, requires=_VLLM_TRITON, label="vllm_triton",
                  computes=("output",), constants=VARIANT_CONSTANTS)
    if chunked(definition):  # vLLM runs it as plain attention over chunk-sized virtual requests: no native here
        return []
    # SGLang's Triton kernels take a window, a tanh cap and sinks too, on its page size of 1
    sglang = Native("sglang", "sglang_triton_attention.py", must_fit=True, requires=_SGLANG_TRITON,
                    label="sglang_triton", computes=("output",), constants=VARIANT_CONSTANTS)
    on_sglangs_cache = kind == "paged" and definition.const_axes.get("page_size") == 1 and _sglang_computes(definition)
    if is_variant(definition):
        if kind != "paged":
            return []
        # FlashInfer's paged wrappers take a window and a cap (``window_left``, ``logits_soft_cap``); its
        # sink wrapper (a prefill kernel's variant) those and the sinks, without their log-sum-exp
        flashinfer = Native("flashinfer", "flashinfer_paged_attention.py", must_fit=True, constants=VARIANT_CONSTANTS)
        if "sinks" in definition.inputs:
            flashinfer = Native("flashinfer", "flashinfer_sink_attention.py", must_fit=True,
                                constants=VARIANT_CONSTANTS, computes=("output",))
        return [flashinfer, vllm] + ([sglang] if on_sglangs_cache else [])
    natives = [Native("flashinfer", f"flashinfer_{kind}_attention.py", must_fit=True)]
    if kind == "paged":  # neither Triton kernel computes the log-sum-exp: ``output`` only
        natives += [vllm] + ([sglang] if on_sglangs_cache else [])
    return natives


def fp8_input(definition: Definition, name: str) -> bool:
    """Whether the Definition takes its input ``name`` in FP8 e4m3."""
    spec = definition.inputs.get(name)
    return spec is not None and spec.dtype is DType.float8_e4m3fn


def _sglang_computes(definition: Definition) -> bool:
    """Whether SGLang's Triton kernels compute a Definition: any over a cache of the model's dtype;
    over an FP8 cache its decode only, with FP8 queries where query heads share a KV head (its
    grouped kernel casts them) and queries in the model's dtype where they do not."""
    if not fp8_input(definition, "k_cache"):
        return True
    grouped = definition.const_axes.get("num_qo_heads") != definition.const_axes.get("num_kv_heads")
    return "qo_indptr" not in definition.inputs and grouped == fp8_input(definition, "q")


def _engine_kernel(run: EngineRun, definition: Definition) -> EngineKernel:
    backend, framework = run.attention_backend.lower(), run.framework.lower()
    if backend == "flashinfer":
        return EngineKernel("flashinfer", f"the {run.attention_backend} attention backend")
    if definition.op_type == "gqa_paged" and (framework, backend) == ("vllm", "triton_attn"):
        return EngineKernel("vllm_triton", "vLLM's TRITON_ATTN backend (its Triton unified attention kernel)")
    if definition.op_type == "gqa_paged" and (framework, backend) == ("sglang", "triton") \
            and definition.const_axes.get("page_size") == 1 and not chunked(definition):
        return EngineKernel("sglang_triton", "SGLang's triton attention backend (its decode and extend kernels)")
    return EngineKernel(None, f"the {run.attention_backend} attention backend, which the replay has no solution of")


def _rounds_through(definition: Definition) -> Optional[torch.dtype]:
    """With FP8 queries the engine's kernel multiplies FP8 probabilities with FP8 values (vLLM's
    Triton attention and SGLang's grouped Triton decode cast them to V's dtype), which the
    references keep in float32: FP8's precision bounds the check."""
    return torch.float8_e4m3fn if fp8_input(definition, "q") else None


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("gqa_paged", "gqa_ragged"),
    templates=tuple(f"gqa_paged_{kind}_h32_kv8_d128_ps{ps}{quantized}" for kind in ("decode", "prefill_causal")
                    for ps in (1, 16) for quantized in ("", FP8_CACHE, FP8_QUERY + FP8_CACHE))
    + tuple(variant_template(kind, ps, sinks, chunk) for kind in ("decode", "prefill_causal") for ps in (1, 16)
            for sinks, chunk in ((False, False), (True, False), (False, True))),
    baselines=(Baseline("torch_paged_attention.py", compiled=False, op_type="gqa_paged",
                        optional_constants=VARIANT_CONSTANTS + (CHUNK_CONSTANT,)),
               Baseline("torch_ragged_attention.py", compiled=False, op_type="gqa_ragged")),
    natives=_natives,
    engine_kernel=_engine_kernel,
    kernel_words=KERNEL_WORDS,
    rounds_through=_rounds_through,
)
