"""How layers that vLLM and SGLang share in shape (same class names, same attributes) turn into
op-table calls: norms, SwiGLU, RoPE, linear layers, lm_head, token embedding, the fused MoE call."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from profiler.capture import ops


def rmsnorm(self: Any, x: torch.Tensor, residual: Optional[torch.Tensor] = None, *_: Any, **__: Any) -> list:
    return [ops.rmsnorm(x, residual, float(self.variance_epsilon))]


def silu_and_mul(self: Any, x: torch.Tensor, *_: Any, **__: Any) -> list:
    return [ops.silu_and_mul(x)]


def rope(self: Any, positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor] = None, *_: Any, **__: Any) -> list:
    if not self.is_neox_style or self.rotary_dim != self.head_size:
        raise NotImplementedError(
            f"{type(self).__name__}: only full-head NeoX-style RoPE has a Definition "
            f"(is_neox_style={self.is_neox_style}, rotary_dim={self.rotary_dim}, head_size={self.head_size})"
        )
    tokens = positions.numel()
    num_q_heads = query.numel() // (tokens * self.head_size)
    num_kv_heads = key.numel() // (tokens * self.head_size) if key is not None else 0
    params = ops.RopeParams(
        theta=float(self.base),
        factor=float(getattr(self, "scaling_factor", 1.0)),
        low_freq_factor=float(getattr(self, "low_freq_factor", 1.0)),
        high_freq_factor=float(getattr(self, "high_freq_factor", 4.0)),
        original_max_position=int(getattr(self, "orig_max_position", 8192)),
    )
    return [ops.rope(positions, query, num_q_heads, num_kv_heads, self.head_size, params)]


def linear(self: Any, layer: Any, x: torch.Tensor, *_: Any, **__: Any) -> list:
    return [ops.gemm(x, layer.weight)]


def lm_head(self: Any, first: Any, second: Any, *_: Any, **__: Any) -> list:
    """The logits projection: vLLM passes (lm_head, hidden_states), SGLang (hidden_states, lm_head)."""
    head, hidden_states = (first, second) if hasattr(first, "weight") else (second, first)
    return [ops.gemm(hidden_states, head.weight)]


def embedding(self: Any, input_: torch.Tensor, *_: Any, **__: Any) -> list:
    return [ops.embedding(input_, self.weight)]


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
