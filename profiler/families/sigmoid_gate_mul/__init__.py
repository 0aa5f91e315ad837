"""A sigmoid gate on an activation, op type ``sigmoid_gate_mul``: ``x * sigmoid(gate)`` computed in a
model's own code, before its next projection. The gate is as wide as ``x`` (a gated attention layer's
output gate, split from its query projection: Qwen3-Next's and Qwen3.5's full-attention layers) or
one value per token (``gate_size`` 1: a shared expert's output times the sigmoid of its gate's logit,
as vLLM's Qwen2-MoE MLP runs it). vLLM and SGLang run it as PyTorch's two elementwise kernels, or
Inductor's one where vLLM compiles the layer."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.graph_capture import CAPTURING
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.capture.layers import computes_in_own_code, held_set, own_code_problem, recorded_elsewhere, require
from fi_profile.capture.patching import wrap
from fi_profile.capture.recorder import RECORDER
from fi_profile.families.engine_kernels import INDUCTOR_KERNELS
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "sigmoid_gate_mul"
#: what a gated layer holds that the watch records (:func:`watched`): an attention's output gate
#: flag, an MLP's gate layer
WATCHED = ("attn_output_gate", "expert_gate")
_TEMPLATE = "sigmoid_gate_mul_h4096"


def problem(x: torch.Tensor, gate: torch.Tensor) -> Optional[str]:
    """Why ``x * sigmoid(gate)`` is not what the Definitions compute (a gate as wide as ``x`` or one
    value per row, both of ``x``'s dtype), or None."""
    same_rows = tuple(x.shape[:-1]) == tuple(gate.shape[:-1])
    if not same_rows or int(gate.shape[-1]) not in (int(x.shape[-1]), 1) or x.dtype != gate.dtype:
        return (f"a sigmoid gate of shape {tuple(gate.shape)} ({gate.dtype}) on an activation of shape "
                f"{tuple(x.shape)} ({x.dtype}): no Definition computes it")
    if not x.dtype.is_floating_point:
        return f"a sigmoid gate on a {x.dtype} activation: no Definition computes it"
    return None


def call(x: torch.Tensor, hidden: Optional[int] = None, gate_size: Optional[int] = None) -> KernelCall:
    """The gate over ``x`` ([tokens, hidden], or more leading dims); or, with ``hidden``, over the
    tokens of another activation ``x`` (one row per token: where a compiled layer's hook sees its
    QKV projection, not the gate). ``gate_size``: the gate's width (default ``hidden``; 1 for one
    gate value per token)."""
    return sized_call(rows(x, int(x.shape[-1])), int(hidden if hidden is not None else x.shape[-1]), x.dtype,
                      gate_size)


def sized_call(tokens: int, hidden: int, dtype: torch.dtype, gate_size: Optional[int] = None) -> KernelCall:
    """The gate over ``tokens`` rows of ``hidden``; named ``..._g{gate_size}`` where the gate is narrower."""
    gate_size = hidden if gate_size is None else int(gate_size)

    def build() -> Definition:
        schema = schema_dtype(dtype)
        narrower = "" if gate_size == hidden else f"_g{gate_size}"
        return definition_for(_TEMPLATE, f"sigmoid_gate_mul_h{hidden}{narrower}{dtype_suffix(schema)}",
                              {"hidden_size": hidden, "gate_size": gate_size}, schema)

    definition = cached_definition((KEY, hidden, gate_size, dtype), build)
    return KernelCall(definition, {"num_tokens": tokens})


def layer_problem(method: str) -> Callable[[Any], Optional[str]]:
    """A rule for a gated layer class whose ``method`` a hook watches (:func:`watched`): a layer
    with a gate (:func:`~fi_profile.capture.layers.computes_in_own_code`) whose class runs another
    ``method`` of its own (a subclass's, which the watch never sees) is listed; None otherwise."""

    def problem(layer: Any) -> Optional[str]:
        computes = computes_in_own_code(layer)
        gates = [name for name in computes if name in WATCHED]
        others = [name for name in computes if name not in WATCHED]
        if others:
            return own_code_problem(layer, others)
        if gates and getattr(getattr(type(layer), method, None), "__fi_profile_original__", None) is None:
            return (f"{type(layer).__name__} with {', '.join(gates)} in a {method} of its own (its sigmoid and "
                    "product: no hook records them)")
        return None

    return problem


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    """Inductor's kernel where the accounting saw one (vLLM's compiled forward), else PyTorch's."""
    if any(name.startswith(INDUCTOR_KERNELS) for name in run.kernels) or (
            run.framework == "vLLM" and "compiled" in run.execution):
        return EngineKernel("torch_compile", "Inductor's generated kernel (the layer's PyTorch code compiled)")
    return EngineKernel("torch", "PyTorch's sigmoid and multiply, as the layer's code calls them")


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=(KEY,),
    templates=(_TEMPLATE,),
    baselines=(Baseline("torch_sigmoid_gate_mul.py"),),
    engine_kernel=_engine_kernel,
)


def _sigmoid(compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    return compute()


def _product(compute: Callable[[], torch.Tensor], x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return compute()


def _records_nothing() -> list:
    return []


def _gate_calls(x: torch.Tensor, gate: torch.Tensor) -> list:
    require(problem(x, gate))
    return [call(x, gate_size=int(gate.shape[-1]))]


#: the gate's sigmoid: recording nothing of its own, its kernels (and graph nodes) the product's call
_fed_sigmoid = wrap(_sigmoid, "sigmoid_gate_sigmoid", _records_nothing, feeds=KEY)
#: the product of the attention output and the sigmoid: the call
_gated_product = wrap(_product, KEY, _gate_calls)
_SIGMOIDS = (torch.sigmoid, torch.Tensor.sigmoid)
_PRODUCTS = (torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.mul, torch.mul)


class OutputGate(TorchFunctionMode):
    """While a gated layer runs (its hook enters this): its first sigmoid is its gate's, and the
    product of that sigmoid's output with a tensor is the gate's call, whose kernels (and graph
    nodes) are the sigmoid's and the product's. Leaving the layer with a gate it did not see (an
    engine version that fuses it into a kernel of its own) loses a call, named: never silent."""

    def __init__(self, layer: Any) -> None:
        super().__init__()
        self.layer = type(layer).__name__
        self.sigmoid: Optional[torch.Tensor] = None
        self.done = False

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if not self.done and not kwargs:
            if self.sigmoid is None and any(func is f for f in _SIGMOIDS) and len(args) == 1:
                self.sigmoid = _fed_sigmoid(lambda: func(*args))
                return self.sigmoid
            if self.sigmoid is not None and any(func is f for f in _PRODUCTS) and len(args) == 2 \
                    and any(a is self.sigmoid for a in args):
                x = args[1] if args[0] is self.sigmoid else args[0]
                self.done = True
                return _gated_product(lambda: func(*args), x, self.sigmoid)
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc: Any) -> Any:
        result = super().__exit__(*exc)
        if exc[0] is None and not self.done:
            RECORDER.lost(KEY, NotImplementedError(
                f"{self.layer}'s sigmoid gate ran no sigmoid and product fi-profile knows (a kernel of its own?): "
                "not recorded"))
        return result


def watched(self: Any) -> Any:
    """The context a gated layer's forward runs in (its hook, an around hook, which does nothing
    while Dynamo traces): :class:`OutputGate` where the layer has a gate (an attention's
    ``attn_output_gate``, an MLP's ``expert_gate``) that no other hook records (vLLM's MoE call
    records the shared expert's where its opaque op runs it) and the hooks record now (eagerly, or
    while a CUDA graph is captured), else nothing."""
    if not (RECORDER.active or CAPTURING.trace is not None):
        return contextlib.nullcontext()
    gates = held_set(self, WATCHED)
    if not gates:
        return contextlib.nullcontext()
    if any(isinstance(getattr(self, gate), torch.nn.Module) and recorded_elsewhere(getattr(self, gate))
           for gate in gates):
        return contextlib.nullcontext()
    return OutputGate(self)
