"""What the engines run for the families whose kernels are alike across them: a layer's custom
op (norms, activations, RoPE) and an unquantized linear or embedding layer's torch call."""

from __future__ import annotations

from typing import Optional

from fi_profile.families.family import EngineKernel, EngineRun
from fi_profile.schema.definition import Definition


def custom_op(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """vLLM's ``_C`` kernel when eager, Inductor's generated one inside its compiled forward;
    SGLang's sgl-kernel (FlashInfer's kernels)."""
    if run.framework == "vLLM":
        if "compiled" in run.execution:
            return EngineKernel("torch_compile", "Inductor's generated kernel (vLLM's compiled forward)")
        return EngineKernel("vllm", "vLLM's _C kernel")
    if run.framework == "SGLang":
        return EngineKernel("flashinfer", "sgl-kernel's (FlashInfer's) kernel")
    return None


def torch_call(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    return EngineKernel("torch", "F.linear / F.embedding (cuBLAS), as unquantized layers call them")
