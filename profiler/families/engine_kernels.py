"""What the engines run for the families whose kernels are alike across them: a layer's custom
op (norms, activations, RoPE) and an unquantized linear or embedding layer's torch call."""

from __future__ import annotations

from typing import Callable, Optional

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


#: the names Inductor gives the kernels it generates: pointwise, reduction, persistent reduction, template
INDUCTOR_KERNELS = ("triton_poi_", "triton_red_", "triton_per_", "triton_tem_")


def sglang_gpu_kernel(run: EngineRun, definition: Definition) -> EngineKernel:
    """What SGLang ran for a layer on a GPU, as the kernels the accounting saw for the Definition's
    calls say: sgl-kernel's (FlashInfer's, named so) where it saw one of those or nothing at all
    (no accounting); else Inductor's where it saw Inductor's (SGLang compiled the layer's PyTorch
    code), PyTorch's own where it saw only those (SGLang's ``Gemma3RMSNorm`` on CUDA is its
    ``forward_native``: a mean, an rsqrt and five elementwise kernels per call); else a kernel the
    replay has none of, named."""
    if not run.kernels or any("flashinfer" in name.lower() for name in run.kernels):
        return EngineKernel("flashinfer", "sgl-kernel's (FlashInfer's) kernel")
    if any(name.startswith(INDUCTOR_KERNELS) for name in run.kernels):
        return EngineKernel("torch_compile", "Inductor's kernels: SGLang compiled the layer's PyTorch code")
    if all("at::native::" in name for name in run.kernels):
        return EngineKernel("torch", "PyTorch's own kernels: SGLang ran the layer's PyTorch code")
    return EngineKernel(None, f"SGLang's {definition.op_type} kernel {run.kernels[0][:60]}, which the replay has "
                              "no solution of")


def custom_op(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """vLLM's ``_C`` kernel when eager, Inductor's generated one inside its compiled forward;
    SGLang's sgl-kernel (FlashInfer's kernels) on a GPU, unless the kernels the accounting saw say
    otherwise (:func:`sglang_gpu_kernel`)."""
    if run.framework == "vLLM":
        if "compiled" in run.execution:
            return EngineKernel("torch_compile", "Inductor's generated kernel (vLLM's compiled forward)")
        return EngineKernel("vllm", "vLLM's _C kernel")
    if run.framework == "SGLang":
        if sglang_on_cpu(run):
            return sglang_cpu_kernel(definition)
        return sglang_gpu_kernel(run, definition)
    return None


def torch_call(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    return EngineKernel("torch", "F.linear / F.embedding (cuBLAS), as unquantized layers call them")


def engine_triton(what: str, engines: tuple[str, ...] = ("vLLM",)) -> Callable[[EngineRun, Definition],
                                                                              Optional[EngineKernel]]:
    """For a family whose kernels in ``engines`` (vLLM's by default; SGLang's too for the Gated
    DeltaNet and conv1d kernels, its copies of them) are Triton (CUDA) and whose natives are
    labelled by the engine's name in lower case (``vllm``): that native where the engine ran on a
    GPU, as the accounting's kernel names say (a CPU run's are operators, ``aten::...``,
    ``_C::...``); its CPU path otherwise, which the replay has none of; unknown where the
    accounting names nothing."""
    def engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
        if run.framework not in engines or not run.kernels:
            return None
        if all("::" in name for name in run.kernels):
            return EngineKernel(None, f"{run.framework}'s CPU path for {definition.op_type} ({len(run.kernels)} "
                                      "kinds of operators), which the replay has no solution of")
        return EngineKernel(run.framework.lower(), f"{run.framework}'s Triton {what}")

    return engine_kernel
