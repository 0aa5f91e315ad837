"""Activations, op type ``activation``: gated ones over a ``[tokens, 2 * intermediate]`` input,
gate half first (SwiGLU's ``silu(gate) * up``, GeGLU's ``gelu(gate) * up``: Gemma's, GELU's tanh
approximation or exact), and the squared ReLU of Nemotron-H's MLPs (``relu(x)^2``, not gated).
Hooked on the engines' ``SiluAndMul``, ``GeluAndMul`` and ``ReLUSquaredActivation`` / ``ReLU2``
layers."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.capture.layers import exact_class, recorded_elsewhere, require, seen
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "silu_and_mul"


def call(x: torch.Tensor) -> KernelCall:
    return sized_call(rows(x, x.shape[-1]), x.shape[-1] // 2, x.dtype)


def sized_call(num_tokens: int, intermediate_size: int, dtype: torch.dtype) -> KernelCall:
    """SwiGLU of ``num_tokens`` rows of ``2 * intermediate_size`` (where no input tensor is at hand:
    a layer another call records)."""

    def build() -> Definition:
        schema = schema_dtype(dtype)
        return definition_for("silu_and_mul_i14336", f"silu_and_mul_i{intermediate_size}{dtype_suffix(schema)}",
                              {"intermediate_size": intermediate_size, "gate_up_size": 2 * intermediate_size}, schema)

    definition = cached_definition(("silu_and_mul", 2 * intermediate_size, dtype), build)
    return KernelCall(definition, {"num_tokens": num_tokens})


layer_problem = exact_class("SiluAndMul")

#: GELU's forms as the engines' ``GeluAndMul`` names them (``approximate``) -> the Definitions' names
GELU_FORMS = {"tanh": "gelu_tanh_and_mul", "none": "gelu_and_mul"}


def gelu_call(x: torch.Tensor, approximate: str) -> KernelCall:
    """GeGLU: ``gelu(gate) * up`` in GELU's form ``approximate`` (``gelu_tanh_and_mul_i{I}``,
    ``gelu_and_mul_i{I}``; from Gemma-3-27B's templates)."""
    kind = GELU_FORMS[approximate]
    intermediate, dtype = x.shape[-1] // 2, x.dtype

    def build() -> Definition:
        schema = schema_dtype(dtype)
        return definition_for(f"{kind}_i21504", f"{kind}_i{intermediate}{dtype_suffix(schema)}",
                              {"intermediate_size": intermediate, "gate_up_size": 2 * intermediate}, schema)

    definition = cached_definition((kind, 2 * intermediate, dtype), build)
    return KernelCall(definition, {"num_tokens": rows(x, x.shape[-1])})


def gelu_layer_problem(layer: Any) -> Optional[str]:
    """Why a ``GeluAndMul`` layer is not a GeGLU the Definitions compute (another class, another
    GELU form), or None."""
    problem = exact_class("GeluAndMul")(layer)
    approximate = getattr(layer, "approximate", None)
    if problem is None and approximate not in GELU_FORMS:
        return f"GeluAndMul with approximate={approximate!r} (no Definition computes it)"
    return problem


def gelu_layer_calls(self: Any, x: torch.Tensor) -> list:
    """``GeluAndMul.forward`` (vLLM and SGLang alike)."""
    seen(self)
    require(gelu_layer_problem(self))
    return [gelu_call(x, self.approximate)]


def relu2_call(x: torch.Tensor) -> KernelCall:
    """The squared ReLU of ``[tokens, intermediate]`` (``relu2_i{I}``; from its template's
    Nemotron-H width)."""
    intermediate, dtype = x.shape[-1], x.dtype

    def build() -> Definition:
        schema = schema_dtype(dtype)
        return definition_for("relu2_i21504", f"relu2_i{intermediate}{dtype_suffix(schema)}",
                              {"intermediate_size": intermediate}, schema)

    definition = cached_definition(("relu2", intermediate, dtype), build)
    return KernelCall(definition, {"num_tokens": rows(x, intermediate)})


#: the engines' squared-ReLU layers (vLLM's and SGLang's names)
relu2_layer_problem = exact_class("ReLUSquaredActivation", "ReLU2")


def relu2_layer_calls(self: Any, x: torch.Tensor) -> list:
    """``ReLUSquaredActivation.forward`` (vLLM) and ``ReLU2.forward`` (SGLang)."""
    seen(self)
    require(relu2_layer_problem(self))
    return [relu2_call(x)]


def layer_calls(self: Any, x: torch.Tensor) -> list:
    """``SiluAndMul.forward`` (vLLM and SGLang alike)."""
    seen(self)
    if recorded_elsewhere(self):  # a MoE's shared experts, which its MoE call records
        return []
    require(layer_problem(self))
    return [call(x)]


#: SGLang's activation kernels (CUDA: JIT-compiled on first use)
_SGLANG = "sglang.jit_kernel.activation"


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    if not definition.name.startswith("silu_and_mul"):
        return []
    return [*(Native(library, f"{library}_silu_and_mul.py") for library in ("vllm", "flashinfer")),
            Native("sglang", "sglang_silu_and_mul.py", requires=_SGLANG)]


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """SGLang's ``SiluAndMul`` runs its own JIT kernel on CUDA (``sglang.jit_kernel.activation``;
    ``act_and_mul_kernel`` in the profile), not sgl-kernel's FlashInfer one; vLLM's as its other
    custom ops. GeGLU's kernel (vLLM's ``gelu_tanh_and_mul``, SGLang's, or Inductor's) has no
    replayed solution."""
    if definition.name.startswith("relu2"):
        return EngineKernel(None, f"{run.framework}'s squared-ReLU kernel, which the replay has no solution of")
    if not definition.name.startswith("silu_and_mul"):
        return EngineKernel(None, f"{run.framework}'s GeluAndMul kernel, which the replay has no solution of")
    if run.framework == "SGLang" and not engine_kernels.sglang_on_cpu(run):
        return EngineKernel("sglang", f"SGLang's JIT activation kernel ({_SGLANG})")
    return engine_kernels.custom_op(run, definition)


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("activation",),
    templates=("silu_and_mul_i14336", "gelu_tanh_and_mul_i21504", "gelu_and_mul_i21504", "relu2_i21504"),
    # GeGLU's first: only Definitions that say GELU's form (APPROXIMATE) fit it; SwiGLU's then, the
    # other gated ones (a gate and an up half: gate_up_size); the squared ReLU the rest
    baselines=(Baseline("torch_gelu_and_mul.py", ("APPROXIMATE",)), Baseline("torch_silu_and_mul.py", ("gate_up_size",)),
               Baseline("torch_relu2.py")),
    natives=_natives,
    engine_kernel=_engine_kernel,
    kernel_words=("silu", "act", "swiglu", "act_and_mul", "gelu", "relu"),
)
