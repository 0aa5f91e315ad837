"""RMSNorm, and fused residual add + RMSNorm as the engines run it (in place, the new residual a
second output), in Llama's convention (``x * w``) and Gemma's (``x * (1 + w)``, the weight offset
added in float32: ``gemma_*``), and RMSNorm without a weight (Llama-4's query and key norm:
``rmsnorm_noweight_*``), and gated RMSNorm (``gated_rmsnorm_*``: the normalized rows times SiLU of a
gate, Qwen3-Next's norm after its Gated DeltaNet attention; ``gated_rmsnorm_gate_first_*_gs{G}``:
the rows times SiLU of the gate, then normalized over groups of G columns, Mamba-2's norm after its
scan). Op type ``rmsnorm``; hooked on the engines' ``RMSNorm``, Gemma norm and gated norm layers."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.capture.layers import exact_class, require, seen
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype
from fi_profile.schema.reference import reference_constant

KEY = "rmsnorm"


#: the name part and reference constant of Gemma's weight convention, ``x * (1 + w)``
GEMMA = "gemma_"
WEIGHT_OFFSET = "WEIGHT_OFFSET"
#: the name of the norm without a weight, and its template (Llama-4-Scout's per-head q/k norm)
NO_WEIGHT = "rmsnorm_noweight"
_TEMPLATES = {"rmsnorm": "rmsnorm_h4096", "fused_add_rmsnorm_inplace": "fused_add_rmsnorm_inplace_h4096",
              GEMMA + "rmsnorm": "gemma_rmsnorm_h5376",
              GEMMA + "fused_add_rmsnorm_inplace": "gemma_fused_add_rmsnorm_inplace_h5376",
              NO_WEIGHT: "rmsnorm_noweight_h128_float32", "gated_rmsnorm": "gated_rmsnorm_h128",
              "gated_rmsnorm_gate_first": "gated_rmsnorm_gate_first_h8192_gs1024"}
#: the reference constant of the gate-first norm's group size (a norm over the whole row: the row's size)
GROUP_SIZE = "GROUP_SIZE"


def call(x: torch.Tensor, residual: Optional[torch.Tensor], eps: float, gemma: bool = False,
         weighted: bool = True) -> KernelCall:
    """RMSNorm, or fused add + RMSNorm as the engines run it: in place, with the new residual as a
    second output (named ``fused_add_rmsnorm_inplace_*``: flashinfer-trace's ``fused_add_rmsnorm_*``
    returns the output alone, and a name keeps its interface); ``gemma``: scaled by ``1 + weight``
    (``gemma_*``, from Gemma-3-27B's templates); not ``weighted``: no scale at all
    (``rmsnorm_noweight_*``, no residual)."""
    hidden = x.shape[-1]
    if not weighted and (gemma or residual is not None):
        raise NotImplementedError("RMSNorm without a weight " + ("in Gemma's convention" if gemma else "fused with a "
                                  "residual add") + ": no Definition computes it")
    kind = NO_WEIGHT if not weighted else (GEMMA if gemma else "") + (
        "rmsnorm" if residual is None else "fused_add_rmsnorm_inplace")

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(_TEMPLATES[kind], f"{kind}_h{hidden}{dtype_suffix(dtype)}",
                              {"hidden_size": hidden}, dtype, {"EPS": eps})

    definition = cached_definition((kind, hidden, x.dtype, eps), build)
    return KernelCall(definition, {"batch_size": rows(x, hidden)})


def gated_call(x: torch.Tensor, eps: float) -> KernelCall:
    """Gated RMSNorm over the last dimension of ``x`` (its gate of the same shape): ``gated_rmsnorm_*``."""
    hidden = x.shape[-1]

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(_TEMPLATES["gated_rmsnorm"], f"gated_rmsnorm_h{hidden}{dtype_suffix(dtype)}",
                              {"hidden_size": hidden}, dtype, {"EPS": eps})

    definition = cached_definition(("gated_rmsnorm", hidden, x.dtype, eps), build)
    return KernelCall(definition, {"batch_size": rows(x, hidden)})


def gate_first_call(x: torch.Tensor, group_size: int, eps: float) -> KernelCall:
    """SiLU of the gate times ``x`` (the gate of ``x``'s shape), then RMSNorm over each group of
    ``group_size`` columns: ``gated_rmsnorm_gate_first_*_gs{group_size}``."""
    hidden = x.shape[-1]

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(_TEMPLATES["gated_rmsnorm_gate_first"],
                              f"gated_rmsnorm_gate_first_h{hidden}_gs{group_size}{dtype_suffix(dtype)}",
                              {"hidden_size": hidden}, dtype, {"EPS": eps, GROUP_SIZE: group_size})

    definition = cached_definition(("gated_rmsnorm_gate_first", hidden, group_size, x.dtype, eps), build)
    return KernelCall(definition, {"batch_size": rows(x, hidden)})


_RMSNORM = exact_class("RMSNorm")
_GATED = exact_class("RMSNormGated")
_MIXER2_GATED = exact_class("Mixer2RMSNormGated")


def mixer2_gated_layer_problem(layer: Any) -> Optional[str]:
    """Why Mamba-2's gated norm (vLLM's ``Mixer2RMSNormGated``) is not what
    ``gated_rmsnorm_gate_first_*`` computes on one rank: another class, no norm at all
    (``use_rms_norm=False``), or a norm whose groups span the ranks (one group over a sharded row,
    or groups not divided by the ranks: vLLM all-reduces or all-gathers for them); or None."""
    problem = _MIXER2_GATED(layer)
    if problem is not None:
        return problem
    name, ranks, groups = type(layer).__name__, int(getattr(layer, "tp_size", 1) or 1), int(layer.n_groups)
    if not getattr(layer, "use_rms_norm", True):
        return f"{name} without its norm (use_rms_norm=False: SiLU of the gate times the input, no Definition computes it)"
    if ranks > 1 and (groups == 1 or groups % ranks):
        return (f"{name} with {groups} group(s) over {ranks} ranks (its norm spans the ranks: a collective inside "
                "the norm, no Definition computes it)")
    return None


def mixer2_gated_layer_calls(self: Any, x: torch.Tensor, gate: torch.Tensor) -> list:
    """``Mixer2RMSNormGated.forward`` (vLLM's Mamba-2): the gate first, then a norm per group."""
    seen(self)
    require(mixer2_gated_layer_problem(self))
    return [gate_first_call(x, int(self.group_size), float(self.variance_epsilon))]


def gated_layer_problem(layer: Any) -> Optional[str]:
    """Why a gated norm layer (vLLM's ``RMSNormGated``) is not what ``gated_rmsnorm_*`` computes:
    another class, a norm over groups of the row, a bias, the gate applied before the norm, or a
    gate other than SiLU; or None."""
    return _GATED(layer) or gated_attributes_problem(layer)


def gated_attributes_problem(layer: Any) -> Optional[str]:
    """What a gated norm layer holds that ``gated_rmsnorm_*`` does not compute (groups, a bias, the
    gate first, a gate other than SiLU), whatever its class; or None."""
    hidden = int(layer.weight.shape[-1])
    group = getattr(layer, "group_size", None)
    problems = {
        f"groups of {group}": group not in (None, hidden),
        "a bias": getattr(layer, "bias", None) is not None,
        "the gate before the norm (norm_before_gate=False)": not getattr(layer, "norm_before_gate", True),
        f"a {getattr(layer, 'activation', None)} gate": getattr(layer, "activation", "silu") not in ("silu", "swish"),
    }
    found = [what for what, applies in problems.items() if applies]
    return f"{type(layer).__name__} with {', '.join(found)} (no Definition computes it)" if found else None


def gated_layer_calls(self: Any, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> list:
    """``RMSNormGated.forward`` (vLLM): gated where a gate is given, else a plain RMSNorm."""
    seen(self)
    require(gated_layer_problem(self))
    eps = float(self.eps)
    return [gated_call(x, eps) if z is not None else call(x, None, eps)]
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
    return [call(x, residual, float(self.variance_epsilon), weighted=bool(getattr(self, "has_weight", True)))]


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


#: SGLang's Gemma-3 norm, which runs as PyTorch code on CUDA (its ``forward_native``)
_SGLANG_GEMMA3 = "sglang.srt.layers.layernorm"


def _gemma(definition: Definition) -> bool:
    return reference_constant(definition.reference, WEIGHT_OFFSET) is not None


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    if _gemma(definition):  # Gemma's: SGLang's Gemma3RMSNorm where it computes the Definition
        if "residual" in definition.inputs or "weight" not in definition.inputs:
            return []
        return [Native("sglang", "sglang_gemma3_rmsnorm.py", ("EPS",), requires=_SGLANG_GEMMA3)]
    if "weight" not in definition.inputs or "gate" in definition.inputs:  # no weight, or gated: the baseline only
        return []
    if "residual" in definition.inputs:
        return [Native(library, f"{library}_fused_add_rmsnorm.py", ("EPS",), overwrites=_overwrites)
                for library in ("vllm", "flashinfer")]
    return [Native(library, f"{library}_rmsnorm.py", ("EPS",)) for library in ("vllm", "flashinfer")]


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """As the engines' other custom ops (:func:`engine_kernels.custom_op`); a Gemma norm SGLang ran
    as PyTorch's own kernels on a GPU is its ``Gemma3RMSNorm`` (``GemmaRMSNorm`` runs sgl-kernel's
    FlashInfer norm), which the replay runs as SGLang's native."""
    found = engine_kernels.custom_op(run, definition)
    if (found is not None and found.label == "torch" and run.framework == "SGLang" and _gemma(definition)
            and "residual" not in definition.inputs):
        return EngineKernel("sglang", "SGLang's Gemma3RMSNorm: its forward_native, PyTorch's own kernels")
    return found


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("rmsnorm",),
    templates=tuple(_TEMPLATES.values()),
    # the gate-first norm (its group size a constant) before the gated one, which has the same inputs
    baselines=(Baseline("torch_gated_rmsnorm_gate_first.py", ("EPS", GROUP_SIZE)),
               Baseline("torch_gated_rmsnorm.py", ("EPS",)),
               Baseline("torch_fused_add_rmsnorm.py", ("EPS",), optional_constants=(WEIGHT_OFFSET,)),
               Baseline("torch_rmsnorm.py", ("EPS",), optional_constants=(WEIGHT_OFFSET,)),
               Baseline("torch_rmsnorm_noweight.py", ("EPS",))),
    natives=_natives,
    engine_kernel=_engine_kernel,
    # FLA's gated norm (vLLM's RMSNormGated on CUDA) is a layer-norm kernel of its RMS form
    # Inductor names a kernel after the ops fused into it: a norm's variance is ``mean_mul_pow``, also
    # where it split the norm and its reduction is named after a gate's SiLU besides (vLLM's
    # compiled Mamba-2 gated norm: ``triton_red_fused__to_copy_mean_mul_pow_silu_view_0``)
    # FLA's gated norm (SGLang's FusedRMSNormGated) runs layer_norm_gated_fwd_kernel
    kernel_words=("rms", "rmsnorm", "rms_norm", "rsqrt", "layer_norm_fwd", "norm_gated", "mean_mul_pow"),
    reduces=True,
)
