"""A gated attention layer's prologue in one kernel (Qwen3-Next, Qwen3.5 on CUDA): each query head's
q and output gate taken apart, RMSNorm of every query and key head, partial NeoX-style RoPE from
the layer's cos/sin cache, and the gate passed through. Op type ``qk_norm_rope``: its Definitions
``qk_rmsnorm_rope_gate_with_cos_sin_cache_neox_style_h{H}_kv{KV}_d{D}_rd{R}``, named in the manner of
flashinfer-trace's ``rope_with_cos_sin_cache_neox_style_*``, whose cache layout they share.

The norms' weights are inputs as the kernel applies them (``w + norm_beta``: GemmaRMSNorm's
``1 + w``), in float32; the cache is the layer's own, so one Definition serves any RoPE scaling
that fills it (plain, YaRN, linear). Multimodal RoPE (2-D positions) is another computation."""

from __future__ import annotations

from typing import Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

KEY = "qk_norm_rope"
TEMPLATE = "qk_rmsnorm_rope_gate_with_cos_sin_cache_neox_style_h16_kv2_d256_rd64"
#: the activations' dtypes the Definitions take (the engines' kernel: half precision only)
DTYPES = (DType.bfloat16, DType.float16)


def problem(dtype: torch.dtype, rotary_dim: int, head_size: int, neox_style: bool,
            multimodal: bool) -> Optional[str]:
    """Why a fused q/k norm + RoPE + gate call is no ``qk_norm_rope`` Definition's, or None."""
    if schema_dtype(dtype) not in DTYPES:
        return f"fused q/k RMSNorm + RoPE + gate on {dtype} activations (its Definitions take bfloat16 or float16)"
    if not neox_style:
        return "fused q/k RMSNorm + RoPE + gate with interleaved RoPE (its Definitions rotate NeoX style)"
    if not (0 < rotary_dim <= head_size and rotary_dim % 2 == 0):
        return f"fused q/k RMSNorm + RoPE + gate with rotary_dim={rotary_dim}, head_size={head_size}"
    if multimodal:
        return "fused q/k RMSNorm + RoPE + gate with multimodal RoPE (2-D positions: no Definition computes it)"
    return None


def call(x: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_size: int, rotary_dim: int,
         eps: float, cache: torch.Tensor) -> KernelCall:
    """One call over the tokens of ``x`` (the activations, one row of ``x.shape[-1]`` per token: the
    QKV projection's output), with the layer's cos/sin ``cache`` (its positions, its dtype)."""
    dtype, cache_type = schema_dtype(x.dtype), schema_dtype(cache.dtype)

    def build() -> Definition:
        return definition_for(
            TEMPLATE,
            f"qk_rmsnorm_rope_gate_with_cos_sin_cache_neox_style_h{num_q_heads}_kv{num_kv_heads}_d{head_size}"
            f"_rd{rotary_dim}{dtype_suffix(dtype)}" + ("" if cache_type is dtype else f"_cache_{cache_type.value}"),
            {"num_qo_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_size": head_size,
             "gated_head_size": 2 * head_size, "rotary_dim": rotary_dim},
            dtype, {"EPS": eps}, input_dtypes={} if cache_type is dtype else {"cos_sin_cache": cache_type})

    definition = cached_definition((KEY, num_q_heads, num_kv_heads, head_size, rotary_dim, eps, dtype, cache_type), build)
    return KernelCall(definition, {"num_tokens": rows(x, int(x.shape[-1])), "max_seq_len": int(cache.shape[0])})


#: where vLLM's kernel lives (Triton: CUDA only)
_VLLM_KERNEL = "vllm.model_executor.layers.fused_qk_norm_rope"


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    return [Native("vllm", "vllm_qk_rmsnorm_rope_gate.py", constants=("EPS",), requires=_VLLM_KERNEL)]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=(KEY,),
    templates=(TEMPLATE,),
    baselines=(Baseline("torch_qk_norm_rope.py", ("EPS",)),),
    natives=_natives,
    # eager and in its compiled forward alike (Inductor calls a Triton kernel as it is)
    engine_kernel=engine_kernels.engine_triton("kernel fused_qk_rmsnorm_rope_gate"),
    # vLLM's ``_fused_qk_rmsnorm_rope_gate_kernel``
    kernel_words=("qk_rmsnorm_rope", "rmsnorm_rope"),
    reduces=True,
)
