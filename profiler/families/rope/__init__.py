"""Rotary position embedding on queries and keys: full-head NeoX style, plain, with Llama-3
frequency scaling or with linear position scaling (Gemma-3's global layers); YaRN-scaled RoPE, both
DeepSeek's (interleaved pairs, on MLA's rotary parts ``q_pe`` / ``k_pe``) and the generic one of
Qwen and gpt-oss (``YaRNScalingRotaryEmbedding``, NeoX style, its ramp truncated or not). Op type
``rope``; hooked on the engines' ``RotaryEmbedding`` layers and vLLM's
``DeepseekScalingRotaryEmbedding`` (SGLang's derives from its ``RotaryEmbedding``)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix
from fi_profile.capture.layers import judged_once, require, seen
from fi_profile.families import engine_kernels
from fi_profile.families.family import FITTED_BASELINE, Baseline, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

KEY = "rope"
#: the constants of the Definitions' references (and of the PyTorch baselines): NeoX style (plain
#: or Llama-3 scaled), and DeepSeek's YaRN
CONSTANTS = ("ROPE_THETA", "FACTOR", "LOW_FREQ_FACTOR", "HIGH_FREQ_FACTOR", "ORIGINAL_MAX_POSITION")
YARN_CONSTANTS = ("ROPE_THETA", "FACTOR", "ORIGINAL_MAX_POSITION", "BETA_FAST", "BETA_SLOW", "MSCALE",
                  "EXTRAPOLATION_FACTOR")
#: the generic YaRN's besides (DeepSeek's Definitions leave them out: truncated, interleaved)
GENERIC_YARN_CONSTANTS = ("TRUNCATE", "NEOX_STYLE")
#: DeepSeek-V3's YaRN constants, which its Definitions' names leave out
DEEPSEEK_V3_YARN = {"ROPE_THETA": 10000.0, "FACTOR": 40.0, "ORIGINAL_MAX_POSITION": 4096}


@dataclass(frozen=True)
class RopeParams:
    """Rotary parameters; ``factor == 1`` is plain RoPE (the Llama-3 formula reduces to it)."""

    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    #: positions divided by it (``rope_type: linear``, Gemma-3's global layers); 1: none
    linear_factor: float = 1.0
    #: the head dimensions rotated, the first ones (partial rotary: Qwen3-Next, GLM, Phi); None: all
    rotary_dim: Optional[int] = None


@dataclass(frozen=True)
class YarnParams:
    """DeepSeek's YaRN scaling (``DeepseekScalingRotaryEmbedding``): ``mscale`` is the magnitude cos
    and sin are scaled by (the engines' own ``self.mscale``, mscale over mscale_all_dim and SGLang's
    attn_factor folded in); ``extrapolation_factor`` SGLang's (vLLM has none: 1)."""

    theta: float
    factor: float
    original_max_position: int
    beta_fast: float
    beta_slow: float
    mscale: float
    extrapolation_factor: float = 1.0
    #: the generic YaRN (``YaRNScalingRotaryEmbedding``: Qwen's, gpt-oss's), not DeepSeek's
    generic: bool = False
    #: the correction range's ends rounded to whole dimensions (always in DeepSeek's)
    truncate: bool = True
    neox_style: bool = False


def call(query: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
         params: "RopeParams | YarnParams") -> KernelCall:
    """RoPE on ``query`` (and its keys): one position per token."""
    def build() -> Definition:
        if isinstance(params, YarnParams):
            return _yarn_definition(num_q_heads, num_kv_heads, head_dim, params, schema_dtype(query.dtype))
        return _definition(num_q_heads, num_kv_heads, head_dim, params, schema_dtype(query.dtype))

    definition = cached_definition(("rope", num_q_heads, num_kv_heads, head_dim, params, query.dtype), build)
    return KernelCall(definition, {"num_tokens": query.numel() // (num_q_heads * head_dim)})


def _definition(num_q_heads: int, num_kv_heads: int, head_dim: int, params: RopeParams, dtype: DType) -> Definition:
    if params.linear_factor != 1.0:
        return definition_for(
            "rope_linear_neox_style_h32_kv16_d128",
            f"rope_linear_neox_style_h{num_q_heads}_kv{num_kv_heads}_d{head_dim}_theta{int(params.theta)}"
            f"_f{params.linear_factor:g}".replace(".", "p") + dtype_suffix(dtype),
            {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
            dtype,
            {"ROPE_THETA": float(params.theta), "LINEAR_FACTOR": float(params.linear_factor)},
        )
    style = "rope_llama3_neox_style" if params.factor != 1.0 else "rope_neox_style"
    theta = "" if params.theta == 500000.0 else f"_theta{int(params.theta)}"
    values = dict(zip(CONSTANTS, (float(params.theta), float(params.factor), float(params.low_freq_factor),
                                  float(params.high_freq_factor), int(params.original_max_position))))
    partial = params.rotary_dim is not None and params.rotary_dim != head_dim
    template = PARTIAL_TEMPLATE if partial else "rope_llama3_neox_style_h32_kv8_d128"
    if partial:  # flashinfer-trace's naming of partial rotary: ``_d{head_dim}_rd{rotary_dim}``
        values["ROTARY_DIM"] = int(params.rotary_dim)  # type: ignore[arg-type]
    return definition_for(
        template,
        f"{style}_h{num_q_heads}_kv{num_kv_heads}_d{head_dim}{f'_rd{params.rotary_dim}' if partial else ''}{theta}"
        f"{dtype_suffix(dtype)}",
        {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
        dtype,
        values,
    )


#: the template of partial rotary (Qwen3-Next-80B's full-attention layers: 64 of 256 dimensions)
PARTIAL_TEMPLATE = "rope_neox_style_h16_kv2_d256_rd64_theta10000000"
#: the classes whose rotary part may be the first dimensions of the head only (their Definitions
#: say ``_rd{R}``); the others' Definitions rotate the whole head
PARTIAL_CLASSES = ("RotaryEmbedding", "Llama3RotaryEmbedding")


def _yarn_definition(num_q_heads: int, num_kv_heads: int, head_dim: int, params: YarnParams, dtype: DType) -> Definition:
    values = dict(zip(YARN_CONSTANTS, (float(params.theta), float(params.factor), int(params.original_max_position),
                                       float(params.beta_fast), float(params.beta_slow), float(params.mscale),
                                       float(params.extrapolation_factor))))
    if params.generic:
        return definition_for(
            "rope_yarn_neox_style_h64_kv8_d64_theta150000_f32_ctx4096_untruncated",
            f"rope_yarn_{'neox_style' if params.neox_style else 'interleaved'}_h{num_q_heads}_kv{num_kv_heads}"
            f"_d{head_dim}{_generic_yarn_suffix(params)}{dtype_suffix(dtype)}",
            {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
            dtype,
            {**values, "TRUNCATE": params.truncate, "NEOX_STYLE": params.neox_style},
        )
    return definition_for(
        "rope_deepseek_yarn_h128_kv1_d64",
        f"rope_deepseek_yarn_h{num_q_heads}_kv{num_kv_heads}_d{head_dim}{_yarn_suffix(values)}{dtype_suffix(dtype)}",
        {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
        dtype,
        values,
    )


def yarn_mscale(factor: float) -> float:
    """YaRN's magnitude for a context scaled by ``factor`` (the engines' ``yarn_get_mscale``)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _generic_yarn_suffix(params: YarnParams) -> str:
    """The generic YaRN's name: theta, factor and original context always (no model's are the
    default), then what differs from YaRN's defaults by value: the betas (32, 1), a magnitude other
    than :func:`yarn_mscale` (an attention factor), an extrapolation factor, an untruncated ramp."""
    suffix = f"_theta{_number(params.theta)}_f{params.factor:g}_ctx{params.original_max_position}"
    if (params.beta_fast, params.beta_slow) != (32.0, 1.0):
        suffix += f"_b{params.beta_fast:g}_{params.beta_slow:g}"
    if not math.isclose(params.mscale, yarn_mscale(params.factor), rel_tol=1e-9):
        suffix += f"_m{params.mscale:.6g}"
    if params.extrapolation_factor != 1.0:
        suffix += f"_x{params.extrapolation_factor:g}"
    if not params.truncate:
        suffix += "_untruncated"
    return suffix.replace(".", "p")


def _number(value: float) -> str:
    """A constant as a name says it: whole numbers in full (``1000000``), others as written (``1.5``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _yarn_suffix(values: dict[str, float]) -> str:
    """What a name adds where the constants are not DeepSeek-V3's: theta, factor and original
    context by value, the rest (betas, magnitude, extrapolation) by a digest of them."""
    suffix = ""
    if values["ROPE_THETA"] != DEEPSEEK_V3_YARN["ROPE_THETA"]:
        suffix += f"_theta{values['ROPE_THETA']:g}"
    if values["FACTOR"] != DEEPSEEK_V3_YARN["FACTOR"]:
        suffix += f"_f{values['FACTOR']:g}"
    if values["ORIGINAL_MAX_POSITION"] != DEEPSEEK_V3_YARN["ORIGINAL_MAX_POSITION"]:
        suffix += f"_ctx{values['ORIGINAL_MAX_POSITION']}"
    rest = tuple(values[c] for c in ("BETA_FAST", "BETA_SLOW", "MSCALE", "EXTRAPOLATION_FACTOR"))
    if rest != (32.0, 1.0, 1.0, 1.0):
        suffix += "_y" + hashlib.sha1(repr(rest).encode()).hexdigest()[:6]
    return suffix


#: the RoPE classes a Definition computes, and how each scales its frequencies (vLLM and SGLang
#: name them alike); YaRN (Qwen's, gpt-oss's), dynamic NTK, multimodal RoPE ... are other
#: computations and are not covered
ROPE_CLASSES = ("RotaryEmbedding", "Llama3RotaryEmbedding", "LinearScalingRotaryEmbedding", "YaRNScalingRotaryEmbedding")
DEEPSEEK_YARN_CLASS = "DeepseekScalingRotaryEmbedding"
GENERIC_YARN_CLASS = "YaRNScalingRotaryEmbedding"


def layer_problem(layer: Any) -> Optional[str]:
    name = type(layer).__name__
    if name == DEEPSEEK_YARN_CLASS:
        if layer.is_neox_style or layer.rotary_dim != layer.head_size:
            return (f"{name} with is_neox_style={layer.is_neox_style}, rotary_dim={layer.rotary_dim}, "
                    f"head_size={layer.head_size} (only interleaved DeepSeek YaRN RoPE over the whole rotary "
                    "part has a Definition)")
        return None
    if name not in ROPE_CLASSES:
        return f"{name} (a RoPE no Definition computes)"
    partial_ok = name in PARTIAL_CLASSES and 0 < layer.rotary_dim <= layer.head_size and layer.rotary_dim % 2 == 0
    if not layer.is_neox_style or (layer.rotary_dim != layer.head_size and not partial_ok):
        return (f"{name} with is_neox_style={layer.is_neox_style}, rotary_dim={layer.rotary_dim}, "
                f"head_size={layer.head_size} (only NeoX-style RoPE has a Definition, over the whole head"
                f"{' or its first dimensions' if name in PARTIAL_CLASSES else ''})")
    if name == GENERIC_YARN_CLASS:
        return judged_once(layer, _generic_yarn_problem)
    if name == "LinearScalingRotaryEmbedding" and len(layer.scaling_factors) != 1:
        return (f"{name} with scaling factors {list(layer.scaling_factors)} (one cos/sin cache per LoRA adapter's "
                "factor: which one a token takes is not known here)")
    return None


def _generic_yarn_problem(layer: Any) -> Optional[str]:
    """Why a generic YaRN layer is not what its Definition computes, or None. Its constants are
    read by name (:func:`_generic_yarn_params`), and the cos/sin cache its own class builds from
    them (``_compute_cos_sin_cache``, what its kernel reads) is checked against theirs, on the CPU:
    a constant a later version adds or folds in otherwise (another magnitude, another ramp) makes
    the cache differ, and is listed with the difference. Judged at the layer's first call, which may
    be traced by torch.compile or captured into a CUDA graph (SGLang captures before any request):
    nothing here runs on the GPU."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    name = type(layer).__name__
    build = getattr(layer, "_compute_cos_sin_cache", None)
    if build is None:
        return f"{name} without _compute_cos_sin_cache (its cos/sin cache cannot be checked against its constants)"
    params = _generic_yarn_params(layer)
    with unset_fake_temporarily(), torch.device("cpu"):
        cache = build().float().cpu()
        if cache.dim() != 2 or cache.shape[-1] != layer.rotary_dim:
            return f"{name} whose cos/sin cache is {tuple(cache.shape)}, not [positions, {layer.rotary_dim}]"
        rows = cache.shape[0]
        positions = torch.unique(torch.cat([torch.arange(0, min(rows, 8192), 7), torch.tensor([rows - 1])]))
        error = float((cache[positions] - _yarn_cos_sin(params, layer.rotary_dim, positions)).abs().max())
    if error > 1e-4 * max(1.0, params.mscale):
        return (f"{name} whose cos/sin cache is not its constants' ({params}: off by {error:.3g}; "
                "an attribute fi-profile does not know)")
    return None


def _yarn_cos_sin(params: YarnParams, dim: int, positions: torch.Tensor) -> torch.Tensor:
    """The generic YaRN's cos/sin cache rows at ``positions``, in float32 as the engines build it
    (the reference's formula)."""
    def correction_dim(rotations: float) -> float:
        return dim * math.log(params.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(params.theta))

    pos_freqs = params.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    low, high = correction_dim(params.beta_fast), correction_dim(params.beta_slow)
    if params.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    keep = (1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1))
    keep = keep * params.extrapolation_factor
    inv_freq = 1.0 / (params.factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos() * params.mscale, angles.sin() * params.mscale], dim=-1)


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
    if type(self).__name__ == DEEPSEEK_YARN_CLASS:
        params: "RopeParams | YarnParams" = _yarn_params(self)
    elif type(self).__name__ == GENERIC_YARN_CLASS:
        params = _generic_yarn_params(self)
    elif type(self).__name__ == "Llama3RotaryEmbedding":  # its own attributes, no defaults: a renamed one is an error
        params = RopeParams(theta=float(self.base), factor=float(self.scaling_factor),
                            low_freq_factor=float(self.low_freq_factor), high_freq_factor=float(self.high_freq_factor),
                            original_max_position=int(self.orig_max_position), rotary_dim=int(self.rotary_dim))
    elif type(self).__name__ == "LinearScalingRotaryEmbedding":
        params = RopeParams(theta=float(self.base), linear_factor=float(self.scaling_factors[0]))
    else:  # unscaled: Llama-3 scaling with factor 1 is the identity
        params = RopeParams(theta=float(self.base), factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position=8192, rotary_dim=int(self.rotary_dim))
    return [call(query, num_q_heads, num_kv_heads, self.head_size, params)]


def _yarn_params(layer: Any) -> YarnParams:
    """A ``DeepseekScalingRotaryEmbedding``'s constants, from its own attributes (vLLM's and
    SGLang's alike; only SGLang's has an extrapolation factor). ``max_position_embeddings`` is the
    model's original context (``original_max_position_embeddings``), as the engines pass it."""
    sglang = type(layer).__module__.startswith("sglang")
    return YarnParams(theta=float(layer.base), factor=float(layer.scaling_factor),
                      original_max_position=int(layer.max_position_embeddings), beta_fast=float(layer.beta_fast),
                      beta_slow=float(layer.beta_slow), mscale=float(layer.mscale),
                      extrapolation_factor=float(layer.extrapolation_factor) if sglang else 1.0)


def _generic_yarn_params(layer: Any) -> YarnParams:
    """A ``YaRNScalingRotaryEmbedding``'s constants, from its own attributes: ``mscale`` holds the
    magnitude (its attention factor folded in, in vLLM and SGLang alike); SGLang's has an
    extrapolation factor; a vLLM or SGLang older than ``truncate`` always truncated."""
    return YarnParams(theta=float(layer.base), factor=float(layer.scaling_factor),
                      original_max_position=int(layer.max_position_embeddings), beta_fast=float(layer.beta_fast),
                      beta_slow=float(layer.beta_slow), mscale=float(layer.mscale),
                      extrapolation_factor=float(getattr(layer, "extrapolation_factor", 1.0)), generic=True,
                      truncate=bool(getattr(layer, "truncate", True)), neox_style=bool(layer.is_neox_style))


def _heads(x: torch.Tensor, head_size: int) -> int:
    if x.dim() >= 3 and x.shape[-1] == head_size:  # [..., heads, head_size]
        return int(x.shape[-2])
    return int(x.shape[-1] // head_size)  # [tokens, heads * head_size]


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """vLLM's and FlashInfer's RoPE, from a cos/sin cache built from the fitted baseline's inverse
    frequencies (its constants set), NeoX style or interleaved as the baseline says."""
    if fitted is None:
        return []
    siblings = {"rope.py": FITTED_BASELINE, "rope_cos_sin.py": "rope_cos_sin.py"}
    return [Native(library, f"{library}_rope.py", siblings=siblings) for library in ("vllm", "flashinfer")]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("rope",),
    templates=("rope_llama3_neox_style_h32_kv8_d128", "rope_deepseek_yarn_h128_kv1_d64",
               "rope_linear_neox_style_h32_kv16_d128", PARTIAL_TEMPLATE,
               "rope_yarn_neox_style_h64_kv8_d64_theta150000_f32_ctx4096_untruncated"),
    # linear RoPE's first: only Definitions that give its factor fit it
    baselines=(Baseline("torch_linear_rope.py", ("ROPE_THETA", "LINEAR_FACTOR")),
               Baseline("torch_rope.py", CONSTANTS, optional_constants=("ROTARY_DIM",)),
               Baseline("torch_yarn_rope.py", YARN_CONSTANTS, optional_constants=GENERIC_YARN_CONSTANTS)),
    natives=_natives,
    engine_kernel=engine_kernels.custom_op,
    kernel_words=("rotary", "rope", "cos_sin"),
    # each output is x1 cos - x2 sin: the engines' kernels round both products at the inputs' magnitude
    # (times YaRN's MSCALE) in the model dtype, so an output near zero is off by a step of the largest
    # (vLLM's kernel on gpt-oss's YaRN, MSCALE 1.35: 25 of 20M elements one bf16 step of 4 off)
    atol_of_largest=True,
)
