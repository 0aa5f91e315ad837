"""What the engines run for the families whose kernels are alike across them: a layer's custom
op (norms, activations, RoPE) and an unquantized linear or embedding layer's torch call."""

from __future__ import annotations

from typing import Optional

from fi_profile.families.family import EngineKernel, EngineRun
from fi_profile.schema.definition import Definition

#: SGLang's CPU attention backends: a run under one of them ran on CPU, its layers on sgl-kernel's
#: CPU ops (or PyTorch), none of which the replay has
SGLANG_CPU_BACKENDS = ("torch_native", "intel_amx")


def sglang_on_cpu(run: EngineRun) -> bool:
    return run.framework == "SGLang" and run.attention_backend.lower() in SGLANG_CPU_BACKENDS


def sglang_cpu_kernel(definition: Definition) -> EngineKernel:
    return EngineKernel(None, f"SGLang's CPU kernel for {definition.op_type} (sgl-kernel's CPU ops), which the replay "
                              "has no solution of")


def custom_op(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """vLLM's ``_C`` kernel when eager, Inductor's generated one inside its compiled forward;
    SGLang's sgl-kernel (FlashInfer's kernels) on a GPU."""
    if run.framework == "vLLM":
        if "compiled" in run.execution:
            return EngineKernel("torch_compile", "Inductor's generated kernel (vLLM's compiled forward)")
        return EngineKernel("vllm", "vLLM's _C kernel")
    if run.framework == "SGLang":
        if sglang_on_cpu(run):
            return sglang_cpu_kernel(definition)
        return EngineKernel("flashinfer", "sgl-kernel's (FlashInfer's) kernel")
    return None


def torch_call(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    return EngineKernel("torch", "F.linear / F.embedding (cuBLAS), as unquantized layers call them")
