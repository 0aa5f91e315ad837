"""RMSNorm, and fused residual add + RMSNorm as the engines run it (in place, the new residual a
second output), in Llama's convention (``x * w``) and Gemma's (``x * (1 + w)``, the weight offset
added in float32: ``gemma_*``). Op type ``rmsnorm``; hooked on the engines' ``RMSNorm`` and Gemma
norm layers."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.capture.layers import exact_class, require, seen
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype
from fi_profile.schema.reference import reference_constant

KEY = "rmsnorm"


#: the name part and reference constant of Gemma's weight convention, ``x * (1 + w)``
GEMMA = "gemma_"
WEIGHT_OFFSET = "WEIGHT_OFFSET"


def call(x: torch.Tensor, residual: Optional[torch.Tensor], eps: float, gemma: bool = False) -> KernelCall:
    """RMSNorm, or fused add + RMSNorm as the engines run it: in place, with the new residual as a
    second output (named ``fused_add_rmsnorm_inplace_*``: flashinfer-trace's ``fused_add_rmsnorm_*``
    returns the output alone, and a name keeps its interface); ``gemma``: scaled by ``1 + weight``
    (``gemma_*``, from Gemma-3-27B's templates)."""
    hidden = x.shape[-1]
    kind = (GEMMA if gemma else "") + ("rmsnorm" if residual is None else "fused_add_rmsnorm_inplace")

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(f"{kind}_h{5376 if gemma else 4096}", f"{kind}_h{hidden}{dtype_suffix(dtype)}",
                              {"hidden_size": hidden}, dtype, {"EPS": eps})

    definition = cached_definition((kind, hidden, x.dtype, eps), build)
    return KernelCall(definition, {"batch_size": rows(x, hidden)})


_RMSNORM = exact_class("RMSNorm")
#: vLLM's and SGLang's Gemma norms (SGLang's Gemma-3 one names its epsilon ``eps``)
GEMMA_NORMS = ("GemmaRMSNorm", "Gemma3RMSNorm")
gemma_layer_problem = exact_class(*GEMMA_NORMS)


def layer_problem(layer: Any) -> Optional[str]:
    """Why an ``RMSNorm`` layer is not what the Definitions compute (another class, or a norm over
    part of the hidden size), or None."""
    problem = _RMSNORM(layer)
    if problem is None and getattr(layer, "variance_size_override", None) is not None:
        return f"{type(layer).__name__} with variance_size_override (normalizes part of the hidden size)"
    return problem


def layer_calls(self: Any, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> list:
    """``RMSNorm.forward`` (vLLM and SGLang alike)."""
    seen(self)
    require(layer_problem(self))
    return [call(x, residual, float(self.variance_epsilon))]


def gemma_layer_calls(self: Any, x: torch.Tensor, residual: Optional[torch.Tensor] = None,
                      post_residual_addition: Optional[torch.Tensor] = None) -> list:
    """A Gemma norm's ``forward`` (vLLM's ``GemmaRMSNorm``, SGLang's ``GemmaRMSNorm`` and
    ``Gemma3RMSNorm``); SGLang's second residual (``post_residual_addition``) is no Definition's."""
    seen(self)
    require(gemma_layer_problem(self))
    if post_residual_addition is not None:
        require(f"{type(self).__name__} with post_residual_addition (a second residual: no Definition computes it)")
    eps = getattr(self, "variance_epsilon", None)
    return [call(x, residual, float(self.eps if eps is None else eps), gemma=True)]


def _overwrites(definition: Definition) -> dict[str, Optional[str]]:
    """vLLM's and FlashInfer's fused add + RMSNorm write the output into hidden_states and the new
    residual into residual; a Definition without that output leaves the residual as scratch."""
    return definition.overwrites or {"hidden_states": "output",
                                     "residual": "residual_out" if "residual_out" in definition.outputs else None}


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    if reference_constant(definition.reference, WEIGHT_OFFSET) is not None:  # Gemma's: the baseline only
        return []
    if "residual" in definition.inputs:
        return [Native(library, f"{library}_fused_add_rmsnorm.py", ("EPS",), overwrites=_overwrites)
                for library in ("vllm", "flashinfer")]
    return [Native(library, f"{library}_rmsnorm.py", ("EPS",)) for library in ("vllm", "flashinfer")]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("rmsnorm",),
    templates=("rmsnorm_h4096", "fused_add_rmsnorm_inplace_h4096", "gemma_rmsnorm_h5376",
               "gemma_fused_add_rmsnorm_inplace_h5376"),
    baselines=(Baseline("torch_fused_add_rmsnorm.py", ("EPS",), optional_constants=(WEIGHT_OFFSET,)),
               Baseline("torch_rmsnorm.py", ("EPS",), optional_constants=(WEIGHT_OFFSET,))),
    natives=_natives,
    engine_kernel=engine_kernels.custom_op,
    kernel_words=("rms", "rmsnorm", "rms_norm", "rsqrt"),
    reduces=True,
)
