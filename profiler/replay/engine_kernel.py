"""Which replayed solution is the kernel the engine ran for a Definition: what the model-level
projection and ``× baseline`` compare against by default (``--baseline engine``).

Read from the capture's record: the engine, how each Definition's calls ran (``run.execution``:
inside vLLM's compiled graph, where Inductor generated the norm / activation / RoPE kernels, or
eagerly, where vLLM calls its ``_C`` kernels), and the attention backend; each op family says
which of its solutions that is (:attr:`fi_profile.families.family.Family.engine_kernel`), where
an engine chooses among several kernels at run time (MoE runners, FP8 GEMMs) by the names its
kernel accounting attributed to the Definition (``run.engine_kernels``). Where the replay has no
solution that is the engine's kernel (vLLM's FlashAttention 3, the engines' MLA latent-cache writes),
there is no engine baseline, and the projection says so instead of comparing against the
PyTorch one."""

from __future__ import annotations

from typing import Optional

from fi_profile.families import family_of
from fi_profile.families.family import EngineKernel, EngineRun
from fi_profile.schema import Definition, KernelCallingRecord
from fi_profile.schema.run_info import RunInfo

__all__ = ["ENGINE", "EngineKernel", "engine_kernel"]

#: ``--baseline`` that means: for each Definition, the kernel the engine ran
ENGINE = "engine"


def engine_kernel(record: Optional[KernelCallingRecord], definition: Definition) -> EngineKernel:
    if record is None:
        return EngineKernel(None, "no capture record: the engine's kernel is unknown")
    run = record.run or RunInfo()
    framework = str(getattr(record.framework, "value", record.framework))
    how = (run.execution or {}).get(definition.name, "eager")
    measured = run.engine_kernels.by_definition.get(definition.name) if run.engine_kernels is not None else None
    engine_run = EngineRun(framework, how, run.attention_backend or "default",
                           tuple(measured.kernels) if measured is not None else ())
    family = family_of(definition.op_type)
    found = None if family is None else family.engine_kernel(engine_run, definition)
    if found is not None:
        return found
    return EngineKernel(None, f"{framework}'s own {definition.op_type} kernel, which the replay has no solution of")
