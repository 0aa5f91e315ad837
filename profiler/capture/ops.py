"""The op table shared by the engine adapters: a kernel-level call in canonical form -> the
Definition it matches and its var-axis values.

Adapters (``hooks/``) only translate an engine's arguments into these functions' arguments;
adding an op is one function here, a template Definition in ``definitions/`` and one adapter line
per engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype


@dataclass
class KernelCall:
    definition: Definition
    axes: dict[str, int]
    #: index tensors (indptr, indices, last-page lengths) worth keeping for replay
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)


_DEFINITIONS: dict[tuple, Definition] = {}


def _cached(key: tuple, build: Callable[[], Definition]) -> Definition:
    """Definitions by a cheap key of the call's constants: the hot path is one dict lookup."""
    definition = _DEFINITIONS.get(key)
    if definition is None:
        definition = _DEFINITIONS[key] = build()
    return definition


def _suffix(dtype: DType) -> str:
    return "" if dtype is DType.bfloat16 else f"_{dtype.value}"


#: dtype names as flashinfer-trace writes them in Definition names (``moe_fp8_block_scale_*``)
_SHORT_DTYPES = {DType.bfloat16: "bf16", DType.float16: "fp16", DType.float32: "fp32"}


def gemm_name(n: int, k: int, dtype: DType) -> str:
    """flashinfer-trace's ``gemm_n{N}_k{K}`` are float16; a GEMM of another dtype has another
    interface, so its own name: ``gemm_bf16_n4096_k4096``."""
    if dtype is DType.float16:
        return f"gemm_n{n}_k{k}"
    return f"gemm_{_SHORT_DTYPES.get(dtype, dtype.value)}_n{n}_k{k}"


def _tokens(x: torch.Tensor, width: int) -> int:
    return x.numel() // width if width else 0


def rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor], eps: float) -> KernelCall:
    """RMSNorm, or fused add + RMSNorm as the engines run it: in place, with the new residual as a
    second output (named ``fused_add_rmsnorm_inplace_*``: flashinfer-trace's ``fused_add_rmsnorm_*``
    returns the output alone, and a name keeps its interface)."""
    hidden = x.shape[-1]
    kind = "rmsnorm" if residual is None else "fused_add_rmsnorm_inplace"

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(f"{kind}_h4096", f"{kind}_h{hidden}{_suffix(dtype)}", {"hidden_size": hidden}, dtype, {"EPS": eps})

    definition = _cached((kind, hidden, x.dtype, eps), build)
    return KernelCall(definition, {"batch_size": _tokens(x, hidden)})


def qk_rmsnorm(q: torch.Tensor, k: torch.Tensor, eps: float) -> KernelCall:
    """RMSNorm of every query and key head in one kernel (SGLang's fused q/k norm), ``[tokens, heads,
    head_dim]`` each."""
    heads, kv_heads, head_dim = int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1])

    def build() -> Definition:
        dtype = schema_dtype(q.dtype)
        return definition_for("qk_rmsnorm_h32_kv4_d128", f"qk_rmsnorm_h{heads}_kv{kv_heads}_d{head_dim}{_suffix(dtype)}",
                              {"num_qo_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}, dtype, {"EPS": eps})

    definition = _cached(("qk_rmsnorm", heads, kv_heads, head_dim, q.dtype, eps), build)
    return KernelCall(definition, {"num_tokens": _tokens(q, heads * head_dim)})


def silu_and_mul(x: torch.Tensor) -> KernelCall:
    width = x.shape[-1]

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(
            "silu_and_mul_i14336",
            f"silu_and_mul_i{width // 2}{_suffix(dtype)}",
            {"intermediate_size": width // 2, "gate_up_size": width},
            dtype,
        )

    definition = _cached(("silu_and_mul", width, x.dtype), build)
    return KernelCall(definition, {"num_tokens": _tokens(x, width)})


def gemm(x: torch.Tensor, n: int, k: int) -> KernelCall:
    """``x [M, k] @ W[n, k].T``: ``n`` and ``k`` are the layer's logical sizes (never read from a
    weight tensor, which a backend may have packed, quantized or replaced by an empty one)."""

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for("gemm_bf16_n4096_k4096", gemm_name(n, k, dtype), {"N": n, "K": k}, dtype)

    definition = _cached(("gemm", n, k, x.dtype), build)
    return KernelCall(definition, {"M": _tokens(x, k)})


def embedding(ids: torch.Tensor, vocab: int, hidden: int, dtype: torch.dtype) -> KernelCall:
    """Rows of a ``[vocab, hidden]`` table of ``dtype`` gathered for ``ids`` (logical sizes)."""

    def build() -> Definition:
        schema = schema_dtype(dtype)
        return definition_for(
            "embedding_v128256_h4096",
            f"embedding_v{vocab}_h{hidden}{_suffix(schema)}",
            {"vocab_size": vocab, "hidden_size": hidden},
            schema,
        )

    definition = _cached(("embedding", vocab, hidden, dtype), build)
    return KernelCall(definition, {"num_tokens": ids.numel()})


@dataclass(frozen=True)
class RopeParams:
    """Rotary parameters; ``factor == 1`` is plain RoPE (the Llama-3 formula reduces to it)."""

    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


def rope(query: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int, params: RopeParams) -> KernelCall:
    """RoPE on ``query`` (and its keys): one position per token."""
    def build() -> Definition:
        return _rope_definition(num_q_heads, num_kv_heads, head_dim, params, schema_dtype(query.dtype))

    definition = _cached(("rope", num_q_heads, num_kv_heads, head_dim, params, query.dtype), build)
    return KernelCall(definition, {"num_tokens": query.numel() // (num_q_heads * head_dim)})


def _rope_definition(num_q_heads: int, num_kv_heads: int, head_dim: int, params: RopeParams, dtype: DType) -> Definition:
    style = "rope_llama3_neox_style" if params.factor != 1.0 else "rope_neox_style"
    theta = "" if params.theta == 500000.0 else f"_theta{int(params.theta)}"
    return definition_for(
        "rope_llama3_neox_style_h32_kv8_d128",
        f"{style}_h{num_q_heads}_kv{num_kv_heads}_d{head_dim}{theta}{_suffix(dtype)}",
        {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
        dtype,
        {
            "ROPE_THETA": float(params.theta),
            "FACTOR": float(params.factor),
            "LOW_FREQ_FACTOR": float(params.low_freq_factor),
            "HIGH_FREQ_FACTOR": float(params.high_freq_factor),
            "ORIGINAL_MAX_POSITION": int(params.original_max_position),
        },
    )


@dataclass
class PagedBatch:
    """One step's paged-KV layout in flashinfer's terms, for the requests of one kind. The page
    ids are gathered from the block table only when asked for (:meth:`gather_kv_indices`): the
    recorder keeps them for a workload it has not seen, and every other step needs only the
    counts, which come from the host."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    _block_table: Optional[torch.Tensor] = None
    _rows: Optional[np.ndarray] = None
    _pages: Optional[np.ndarray] = None
    _kv_indices: Optional[torch.Tensor] = None

    def gather_kv_indices(self) -> torch.Tensor:
        if self._kv_indices is None:
            assert self._block_table is not None and self._rows is not None and self._pages is not None
            self._kv_indices = _gather_pages(self._block_table, self._rows, self._pages, self.kv_indptr.numpy())
        return self._kv_indices

    @property
    def kv_indices(self) -> torch.Tensor:
        return self.gather_kv_indices()

    @property
    def batch_size(self) -> int:
        return len(self.kv_indptr) - 1

    @property
    def total_q(self) -> int:
        return int(self.qo_indptr[-1])


def step_shape(query_start_loc: torch.Tensor, num_reqs: int) -> tuple:
    """What fixes a step's calls but attention's: tokens, requests, and per part (decode, prefill)
    the request count and query tokens. The KV pages are left out: they change every few decode
    steps (every step with page size 1) while nothing else does, so attention is recorded live in
    every step instead (``HookPoint.live``). From CPU tensors (via numpy: this runs every step, and
    numpy is several times cheaper than torch on a few dozen numbers) it needs no device sync."""
    n = num_reqs
    qsl = query_start_loc.numpy()
    q_lens = qsl[1 : n + 1] - qsl[:n]
    decodes, prefills = int((q_lens == 1).sum()), int((q_lens > 1).sum())  # no query token: CUDA-graph padding
    return (int(qsl[n]) - int(qsl[0]), decodes + prefills, decodes, prefills)


def paged_batches(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, page_size: int
) -> tuple[Optional[PagedBatch], Optional[PagedBatch]]:
    """Split a step into its decode requests (one query token) and its prefill requests (more);
    a request with no query token is padding (a CUDA graph's batch), with no attention work.

    ``query_start_loc`` and ``seq_lens`` should be the runner's CPU copies: everything but the page
    ids is computed from them (numpy: this runs every step). The page ids are gathered where the
    block table lives and stay there (see :func:`_gather_pages`)."""
    qsl = query_start_loc.detach().to("cpu", torch.int64).numpy()
    lens = seq_lens.detach().to("cpu", torch.int64).numpy()
    n = len(lens)
    q_lens = qsl[1 : n + 1] - qsl[:n]
    pages = (lens + page_size - 1) // page_size
    parts = []
    for chosen in (q_lens == 1, q_lens > 1):
        idx = chosen.nonzero()[0]
        if idx.size == 0:
            parts.append(None)
            continue
        sel_pages = pages[idx]
        kv_indptr = np.concatenate([[0], sel_pages.cumsum()])
        parts.append(
            PagedBatch(
                qo_indptr=torch.from_numpy(np.concatenate([[0], q_lens[idx].cumsum()]).astype(np.int32)),
                kv_indptr=torch.from_numpy(kv_indptr.astype(np.int32)),
                kv_last_page_len=torch.from_numpy((lens[idx] - (sel_pages - 1) * page_size).astype(np.int32)),
                _block_table=block_table, _rows=idx, _pages=sel_pages,
            )
        )
    return parts[0], parts[1]


def _gather_pages(block_table: torch.Tensor, rows: np.ndarray, pages: np.ndarray, indptr: np.ndarray) -> torch.Tensor:
    """``block_table[r, :pages[r]]`` for each chosen row, concatenated (``indptr`` their offsets),
    as int32, where the table is.

    On a GPU only the rows, page counts and start offsets go up (a few numbers per request, through
    a cached pinned block: a copy from pageable memory would wait for the device to drain its
    stream); the per-page coordinates are expanded there, with the total known on the host so that
    nothing synchronizes."""
    total = int(indptr[-1])
    if block_table.device.type != "cuda":
        cols = np.arange(total) - np.repeat(indptr[:-1], pages)
        return block_table[torch.from_numpy(np.repeat(rows, pages)), torch.from_numpy(cols)].to(torch.int32)
    small = torch.from_numpy(np.stack([rows, pages, indptr[:-1]]).astype(np.int64))
    pinned = torch.empty(small.shape, dtype=torch.int64, pin_memory=True).copy_(small)
    rows_d, pages_d, starts_d = pinned.to(block_table.device, non_blocking=True)
    row_of_page = torch.repeat_interleave(rows_d, pages_d, output_size=total)
    cols = torch.arange(total, device=block_table.device) - torch.repeat_interleave(starts_d, pages_d, output_size=total)
    return block_table[row_of_page, cols].to(torch.int32)


def paged_attention(
    batch: PagedBatch,
    stage: str,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    num_pages: int,
    dtype: DType,
    sm_scale: float,
) -> KernelCall:
    def build() -> Definition:
        consts = {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "page_size": page_size}
        shape = f"h{num_q_heads}_kv{num_kv_heads}_d{head_dim}_ps{page_size}{_suffix(dtype)}"
        kind = "decode" if stage == "decode" else "prefill_causal"
        template = f"gqa_paged_{kind}_h32_kv8_d128_ps{1 if page_size == 1 else 16}"
        return definition_for(template, f"gqa_paged_{kind}_{shape}", consts, dtype)

    definition = _cached(("paged_attention", stage, num_q_heads, num_kv_heads, head_dim, page_size, dtype), build)
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
    return KernelCall(definition, axes, tensors, {"sm_scale": sm_scale})


def paged_attention_calls(decode: Optional[PagedBatch], prefill: Optional[PagedBatch], *shape: object) -> list[KernelCall]:
    """One attention layer's calls in a step: its decode part and its prefill part, where present."""
    parts = (("decode", decode), ("prefill", prefill))
    return [paged_attention(batch, stage, *shape) for stage, batch in parts if batch is not None]


#: MoE routing -> the shipped Definition whose reference routes that way (instantiated per shape)
_MOE_TEMPLATES = {
    "renorm": "moe_bf16_renorm_topk2_e8_h4096_i14336",  # softmax, top-k, weights renormalized
    "softmax": "moe_bf16_softmax_topk8_e64_h2048_i1024",  # softmax, top-k, weights as they are
}
_SHORT_DTYPE = {DType.bfloat16: "bf16", DType.float16: "fp16", DType.float32: "fp32"}


def moe(
    hidden_states: torch.Tensor,
    routing_logits: torch.Tensor,
    num_experts: int,
    top_k: int,
    intermediate_size: int,
    renormalize: bool,
) -> KernelCall:
    """A fused MoE layer (routing + SwiGLU experts) with a softmax top-k router."""
    hidden = hidden_states.shape[-1]
    routing = "renorm" if renormalize else "softmax"

    def build() -> Definition:
        dtype = schema_dtype(hidden_states.dtype)
        logits_dtype = schema_dtype(routing_logits.dtype)
        if dtype not in _SHORT_DTYPE:
            raise NotImplementedError(f"MoE in {dtype.value}: only unquantized bf16/fp16/fp32 MoE has a Definition")
        logits = "" if logits_dtype is dtype else f"_logits_{_SHORT_DTYPE.get(logits_dtype, logits_dtype.value)}"
        return definition_for(
            _MOE_TEMPLATES[routing],
            f"moe_{_SHORT_DTYPE[dtype]}_{routing}_topk{top_k}_e{num_experts}_h{hidden}_i{intermediate_size}{logits}",
            {
                "num_experts": num_experts,
                "top_k": top_k,
                "hidden_size": hidden,
                "intermediate_size": intermediate_size,
                "gemm1_out_size": 2 * intermediate_size,
            },
            dtype,
            input_dtypes={"routing_logits": logits_dtype},
        )

    key = ("moe", routing, num_experts, top_k, hidden, intermediate_size, hidden_states.dtype, routing_logits.dtype)
    definition = _cached(key, build)
    return KernelCall(definition, {"seq_len": _tokens(hidden_states, hidden)})


def sampling(probs_or_logits: torch.Tensor, top_k: bool, top_p: bool) -> Optional[KernelCall]:
    """Top-k and/or top-p sampling (whichever some request of the batch uses) from a distribution
    over the vocabulary; None for plain sampling."""
    if not top_k and not top_p:
        return None
    vocab = probs_or_logits.shape[-1]
    kind = "top_k_top_p" if top_k and top_p else ("top_k" if top_k else "top_p")
    name = f"{kind}_sampling_from_probs_v{vocab}"
    definition = definition_for(f"{kind}_sampling_from_probs_v128256", name, {"vocab_size": vocab}, DType.float32)
    return KernelCall(definition, {"batch_size": probs_or_logits.shape[0]})
