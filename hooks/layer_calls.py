"""How layers that vLLM and SGLang share in shape (same class names, same attributes) turn into
op-table calls: norms, SwiGLU, RoPE, linear layers, lm_head, token embedding, the fused MoE call."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from fi_profile.capture import ops


def rmsnorm(self: Any, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> list:
    return [ops.rmsnorm(x, residual, float(self.variance_epsilon))]


def silu_and_mul(self: Any, x: torch.Tensor) -> list:
    return [ops.silu_and_mul(x)]


def rope(self: Any, query: torch.Tensor, key: Optional[torch.Tensor] = None) -> list:
    """Tokens and heads from ``query`` (``positions`` is not read: while torch.compile traces,
    reading a graph input before the engine does would reorder the graph's inputs)."""
    if not self.is_neox_style or self.rotary_dim != self.head_size:
        raise NotImplementedError(
            f"{type(self).__name__}: only full-head NeoX-style RoPE has a Definition "
            f"(is_neox_style={self.is_neox_style}, rotary_dim={self.rotary_dim}, head_size={self.head_size})"
        )
    # heads from the static last dimensions (``[tokens, heads * head_size]`` or ``[..., heads,
    # head_size]``), never from the token count, which is a symbol while torch.compile traces
    num_q_heads = _heads(query, self.head_size)
    num_kv_heads = _heads(key, self.head_size) if key is not None else 0
    params = ops.RopeParams(
        theta=float(self.base),
        factor=float(getattr(self, "scaling_factor", 1.0)),
        low_freq_factor=float(getattr(self, "low_freq_factor", 1.0)),
        high_freq_factor=float(getattr(self, "high_freq_factor", 4.0)),
        original_max_position=int(getattr(self, "orig_max_position", 8192)),
    )
    return [ops.rope(query, num_q_heads, num_kv_heads, self.head_size, params)]


def _heads(x: torch.Tensor, head_size: int) -> int:
    if x.dim() >= 3 and x.shape[-1] == head_size:  # [..., heads, head_size]
        return int(x.shape[-2])
    return int(x.shape[-1] // head_size)  # [tokens, heads * head_size]


def gemm_size(layer: Any) -> tuple[int, int]:
    """A linear layer's logical ``(N, K)`` on this rank, from the sizes the layer declares.

    Never from ``layer.weight``: backends repack it (vLLM on CPUs with AVX-512 BF16 hands it to
    oneDNN or its own kernel and leaves an empty tensor; SGLang packs it for AMX), quantized
    methods store it packed or transposed, and its shape then says nothing about the GEMM."""
    if hasattr(layer, "num_embeddings_per_partition") and hasattr(layer, "embedding_dim"):  # lm_head
        return int(layer.num_embeddings_per_partition), int(layer.embedding_dim)
    n = getattr(layer, "output_size_per_partition", None)
    if n is None:
        sizes = getattr(layer, "output_partition_sizes", None)
        n = sum(sizes) if sizes else getattr(layer, "output_size", None)
    k = getattr(layer, "input_size_per_partition", None) or getattr(layer, "input_size", None)
    if n is None or k is None:
        raise NotImplementedError(
            f"{type(layer).__name__}: declares no logical sizes (output_size[_per_partition], input_size[_per_partition])"
        )
    return int(n), int(k)


def linear(self: Any, layer: Any, x: torch.Tensor) -> list:
    return [ops.gemm(x, *gemm_size(layer))]


def lm_head(self: Any, lm_head: Any, hidden_states: torch.Tensor) -> list:
    """The logits projection (vLLM and SGLang name these arguments alike, in different orders)."""
    return [ops.gemm(hidden_states, *gemm_size(lm_head))]


def embedding(self: Any, input_: torch.Tensor) -> list:
    dtype = self.weight.dtype  # an emptied or repacked table keeps its dtype; a quantized one would not
    if not dtype.is_floating_point:
        raise NotImplementedError(f"{type(self).__name__}: {dtype} embedding table (quantized): no Definition")
    return [ops.embedding(input_, int(self.num_embeddings_per_partition), int(self.embedding_dim), dtype)]


def moe(hidden_states: torch.Tensor, router_logits: torch.Tensor, unsupported: Mapping[str, bool], *,
        num_experts: int, top_k: int, intermediate_size: int, renormalize: bool) -> list:
    """A MoE layer (routing + SwiGLU experts) as one fused call; ``unsupported`` names the
    features an engine's layer may have that no MoE Definition computes (raised, so the hook
    error says which)."""
    problems = [what for what, applies in unsupported.items() if applies]
    if problems:
        raise NotImplementedError(f"MoE layer without a Definition: {', '.join(problems)}")
    return [ops.moe(hidden_states, router_logits, num_experts=num_experts, top_k=top_k,
                    intermediate_size=intermediate_size, renormalize=renormalize)]


def uncovered_layers(model: Any) -> dict[str, int]:
    """Layers whose kernels no hook records, by kind: a quantized linear, embedding or MoE method
    (the hooks see the unquantized methods only; quantized weights have no Definition here). Read
    once from the built model, so the record can say what it misses instead of dropping it."""
    found: dict[str, int] = {}
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is None or type(method).__name__.startswith("Unquantized"):
            continue
        kind = f"{type(module).__name__} with {type(method).__name__}"
        found[kind] = found.get(kind, 0) + 1
    return found
