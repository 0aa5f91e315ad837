"""A gated attention layer's output gate, op type ``sigmoid_gate_mul``: the attention output times
the sigmoid of the gate its query projection also gave, per element, before the output projection
(Qwen3-Next's and Qwen3.5's full-attention layers: ``attn_output * sigmoid(gate)``). vLLM and
SGLang run it as PyTorch's two elementwise kernels, or Inductor's one where vLLM compiles the layer."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.graph_capture import CAPTURING
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.capture.layers import require
from fi_profile.capture.patching import wrap
from fi_profile.capture.recorder import RECORDER
from fi_profile.families.engine_kernels import INDUCTOR_KERNELS
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "sigmoid_gate_mul"
_TEMPLATE = "sigmoid_gate_mul_h4096"


def problem(x: torch.Tensor, gate: torch.Tensor) -> Optional[str]:
    """Why ``x * sigmoid(gate)`` is not what the Definition computes (other shapes or dtypes), or None."""
    if tuple(x.shape) != tuple(gate.shape) or x.dtype != gate.dtype:
        return (f"an output gate of shape {tuple(gate.shape)} ({gate.dtype}) on an attention output of shape "
                f"{tuple(x.shape)} ({x.dtype}): no Definition computes it")
    if not x.dtype.is_floating_point:
        return f"an output gate on a {x.dtype} attention output: no Definition computes it"
    return None


def call(x: torch.Tensor, hidden: Optional[int] = None) -> KernelCall:
    """The gate over the attention output ``x`` ([tokens, heads x head size], or more leading dims);
    or, with ``hidden`` (heads x head size), over the tokens of another activation ``x`` (one row
    per token: where a compiled layer's hook sees its QKV projection, not the gate)."""
    tokens = rows(x, int(x.shape[-1]))
    hidden = int(hidden if hidden is not None else x.shape[-1])

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(_TEMPLATE, f"sigmoid_gate_mul_h{hidden}{dtype_suffix(dtype)}", {"hidden_size": hidden},
                              dtype)

    definition = cached_definition((KEY, hidden, x.dtype), build)
    return KernelCall(definition, {"num_tokens": tokens})


def layer_problem(method: str) -> Callable[[Any], Optional[str]]:
    """A rule for a gated attention layer class whose ``method`` a hook watches (:func:`watched`):
    a layer with an output gate whose class runs another ``method`` of its own (a subclass's, which
    the watch never sees) is listed; None otherwise."""

    def problem(layer: Any) -> Optional[str]:
        if getattr(layer, "attn_output_gate", False) is not True:
            return None
        if getattr(getattr(type(layer), method, None), "__fi_profile_original__", None) is None:
            return (f"{type(layer).__name__} with attn_output_gate in a {method} of its own (its sigmoid and "
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
    return [call(x)]


#: the gate's sigmoid: recording nothing of its own, its kernels (and graph nodes) the product's call
_fed_sigmoid = wrap(_sigmoid, "sigmoid_gate_sigmoid", _records_nothing, feeds=KEY)
#: the product of the attention output and the sigmoid: the call
_gated_product = wrap(_product, KEY, _gate_calls)
_SIGMOIDS = (torch.sigmoid, torch.Tensor.sigmoid)
_PRODUCTS = (torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.mul, torch.mul)


class OutputGate(TorchFunctionMode):
    """While a gated attention layer runs (its hook enters this): its first sigmoid is its gate's,
    and the product of that sigmoid's output with a tensor is the gate's call, whose kernels (and
    graph nodes) are the sigmoid's and the product's. Leaving the layer with a gate it did not see
    (an engine version that fuses it into a kernel of its own) loses a call, named: never silent."""

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
                f"{self.layer}'s output gate ran no sigmoid and product fi-profile knows (a kernel of its own?): "
                "not recorded"))
        return result


def watched(self: Any) -> Any:
    """The context a gated attention layer's forward runs in (its hook, an around hook, which does
    nothing while Dynamo traces): :class:`OutputGate` where the layer has an output gate
    (``attn_output_gate``) and the hooks record now (eagerly, or while a CUDA graph is captured),
    else nothing."""
    if getattr(self, "attn_output_gate", False) is not True or not (RECORDER.active or CAPTURING.trace is not None):
        return contextlib.nullcontext()
    return OutputGate(self)
