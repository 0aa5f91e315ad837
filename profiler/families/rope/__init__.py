"""Rotary position embedding on queries and keys, full-head NeoX style, plain or with Llama-3
frequency scaling. Op type ``rope``; hooked on the engines' ``RotaryEmbedding`` layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix
from fi_profile.capture.layers import require, seen
from fi_profile.families import engine_kernels
from fi_profile.families.family import FITTED_BASELINE, Baseline, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

KEY = "rope"
#: the constants of the Definitions' references (and of the PyTorch baseline)
CONSTANTS = ("ROPE_THETA", "FACTOR", "LOW_FREQ_FACTOR", "HIGH_FREQ_FACTOR", "ORIGINAL_MAX_POSITION")


@dataclass(frozen=True)
class RopeParams:
    """Rotary parameters; ``factor == 1`` is plain RoPE (the Llama-3 formula reduces to it)."""

    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


def call(query: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int, params: RopeParams) -> KernelCall:
    """RoPE on ``query`` (and its keys): one position per token."""
    def build() -> Definition:
        return _definition(num_q_heads, num_kv_heads, head_dim, params, schema_dtype(query.dtype))

    definition = cached_definition(("rope", num_q_heads, num_kv_heads, head_dim, params, query.dtype), build)
    return KernelCall(definition, {"num_tokens": query.numel() // (num_q_heads * head_dim)})


def _definition(num_q_heads: int, num_kv_heads: int, head_dim: int, params: RopeParams, dtype: DType) -> Definition:
    style = "rope_llama3_neox_style" if params.factor != 1.0 else "rope_neox_style"
    theta = "" if params.theta == 500000.0 else f"_theta{int(params.theta)}"
    values = (float(params.theta), float(params.factor), float(params.low_freq_factor), float(params.high_freq_factor),
              int(params.original_max_position))
    return definition_for(
        "rope_llama3_neox_style_h32_kv8_d128",
        f"{style}_h{num_q_heads}_kv{num_kv_heads}_d{head_dim}{theta}{dtype_suffix(dtype)}",
        {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
        dtype,
        dict(zip(CONSTANTS, values)),
    )


#: the RoPE classes a Definition computes, and how each scales its frequencies (vLLM and SGLang
#: name them alike); YaRN, DeepSeek's YaRN, dynamic NTK, linear scaling, multimodal RoPE ... are
#: other computations and are not covered
ROPE_CLASSES = ("RotaryEmbedding", "Llama3RotaryEmbedding")


def layer_problem(layer: Any) -> Optional[str]:
    name = type(layer).__name__
    if name not in ROPE_CLASSES:
        return f"{name} (a RoPE no Definition computes)"
    if not layer.is_neox_style or layer.rotary_dim != layer.head_size:
        return (f"{name} with is_neox_style={layer.is_neox_style}, rotary_dim={layer.rotary_dim}, "
                f"head_size={layer.head_size} (only full-head NeoX-style RoPE has a Definition)")
    return None


def layer_calls(self: Any, query: torch.Tensor, key: Optional[torch.Tensor] = None) -> list:
    """``RotaryEmbedding.forward`` (vLLM and SGLang alike). Tokens and heads from ``query``
    (``positions`` is not read: while torch.compile traces, reading a graph input before the
    engine does would reorder the graph's inputs)."""
    seen(self)
    require(layer_problem(self))
    # heads from the static last dimensions (``[tokens, heads * head_size]`` or ``[..., heads,
    # head_size]``), never from the token count, which is a symbol while torch.compile traces
    num_q_heads = _heads(query, self.head_size)
    num_kv_heads = _heads(key, self.head_size) if key is not None else 0
    if type(self).__name__ == "Llama3RotaryEmbedding":  # its own attributes, no defaults: a renamed one is an error
        params = RopeParams(theta=float(self.base), factor=float(self.scaling_factor),
                            low_freq_factor=float(self.low_freq_factor), high_freq_factor=float(self.high_freq_factor),
                            original_max_position=int(self.orig_max_position))
    else:  # unscaled: Llama-3 scaling with factor 1 is the identity
        params = RopeParams(theta=float(self.base), factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position=8192)
    return [call(query, num_q_heads, num_kv_heads, self.head_size, params)]


def _heads(x: torch.Tensor, head_size: int) -> int:
    if x.dim() >= 3 and x.shape[-1] == head_size:  # [..., heads, head_size]
        return int(x.shape[-2])
    return int(x.shape[-1] // head_size)  # [tokens, heads * head_size]


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """vLLM's and FlashInfer's RoPE, from a cos/sin cache built from the fitted baseline's inverse
    frequencies (its constants set), for the NeoX-style Definitions."""
    if "neox" not in definition.name or fitted is None:
        return []
    siblings = {"rope.py": FITTED_BASELINE, "rope_cos_sin.py": "rope_cos_sin.py"}
    return [Native(library, f"{library}_rope.py", siblings=siblings) for library in ("vllm", "flashinfer")]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("rope",),
    templates=("rope_llama3_neox_style_h32_kv8_d128",),
    baselines=(Baseline("torch_rope.py", CONSTANTS),),
    natives=_natives,
    engine_kernel=engine_kernels.custom_op,
    kernel_words=("rotary", "rope", "cos_sin"),
)
