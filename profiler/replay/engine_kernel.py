"""Which replayed solution is the kernel the engine ran for a Definition: what the model-level
projection and ``× baseline`` compare against by default (``--baseline engine``).

Read from the capture's record: the engine, how each Definition's calls ran (``run.execution``:
inside vLLM's compiled graph, where Inductor generated the norm / activation / RoPE kernels, or
eagerly, where vLLM calls its ``_C`` kernels), and the attention backend. Where the replay has no
solution that is the engine's kernel (vLLM's TRITON_ATTN attention, SGLang's Triton MoE), there is
no engine baseline, and the projection says so instead of comparing against the PyTorch one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fi_profile.schema import Definition, KernelCallingRecord

#: ``--baseline`` that means: for each Definition, the kernel the engine ran
ENGINE = "engine"
_NORMS_AND_ACTIVATIONS = ("rmsnorm", "activation", "rope")


@dataclass(frozen=True)
class EngineKernel:
    label: Optional[str]  # the baseline label that is the engine's kernel, or None: none here
    what: str  # what the engine ran, in words


def engine_kernel(record: Optional[KernelCallingRecord], definition: Definition) -> EngineKernel:
    if record is None:
        return EngineKernel(None, "no capture record: the engine's kernel is unknown")
    run = record.run or {}
    framework = getattr(record.framework, "value", record.framework)
    how = str(run.get("execution", {}).get(definition.name, "eager"))
    backend = str(run.get("attention_backend", "default"))
    op = definition.op_type
    if op in ("gemm", "embedding"):
        return EngineKernel("torch", "F.linear / F.embedding (cuBLAS), as unquantized layers call them")
    if op in _NORMS_AND_ACTIVATIONS:
        if framework == "vLLM":
            if "compiled" in how:
                return EngineKernel("torch_compile", "Inductor's generated kernel (vLLM's compiled forward)")
            return EngineKernel("vllm", "vLLM's _C kernel")
        if framework == "SGLang":
            return EngineKernel("flashinfer", "sgl-kernel's (FlashInfer's) kernel")
    if op in ("gqa_paged", "gqa_ragged"):
        if backend.lower() == "flashinfer":
            return EngineKernel("flashinfer", f"the {backend} attention backend")
        return EngineKernel(None, f"the {backend} attention backend, which the replay has no solution of")
    if op == "moe" and framework == "vLLM":
        return EngineKernel("vllm", "vLLM's fused MoE (fused_topk + fused_experts)")
    return EngineKernel(None, f"{framework}'s own {op} kernel, which the replay has no solution of")
