"""A MoE block's gated shared expert finished in one kernel, op type ``shared_expert_gate``: the
gate's logit per token, its sigmoid times the shared expert's output, added in place to the routed
experts' output (SGLang's ``fused_gate_sigmoid_mul_add``: Qwen2-MoE, Qwen3-Next). Where an engine
runs the gate as a linear layer and the rest elementwise (vLLM), the gate is a GEMM call."""

from __future__ import annotations

from typing import Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "shared_expert_gate"
_TEMPLATE = "shared_expert_gate_sigmoid_mul_add_h2048"


def call(hidden_states: torch.Tensor) -> KernelCall:
    """The gate, its sigmoid, the product and the add over ``hidden_states`` [tokens, hidden]."""
    hidden = int(hidden_states.shape[-1])

    def build() -> Definition:
        dtype = schema_dtype(hidden_states.dtype)
        return definition_for(_TEMPLATE, f"shared_expert_gate_sigmoid_mul_add_h{hidden}{dtype_suffix(dtype)}",
                              {"hidden_size": hidden}, dtype)

    definition = cached_definition((KEY, hidden, hidden_states.dtype), build)
    return KernelCall(definition, {"num_tokens": rows(hidden_states, hidden)})


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """SGLang's Triton kernel, in place on the routed output as its block calls it."""
    return [Native("sglang", "sglang_shared_expert_gate.py", requires=("sglang.kernels.ops.elementwise.elementwise",
                                                                       "sglang.kernels.ops.layernorm.elementwise"),
                   overwrites=lambda d: {"routed_output": "output"})]


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """SGLang's Triton kernel where it ran on a GPU (its kernel named so); else none known."""
    if run.framework == "SGLang" and any("gate_sigmoid" in kernel for kernel in run.kernels):
        return EngineKernel("sglang", "SGLang's Triton fused_gate_sigmoid_mul_add")
    return None


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=(KEY,),
    templates=(_TEMPLATE,),
    baselines=(Baseline("torch_shared_expert_gate.py"),),
    natives=_natives,
    engine_kernel=_engine_kernel,
    kernel_words=("gate_sigmoid",),
    reduces=True,
)
