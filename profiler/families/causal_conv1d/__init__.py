"""The causal depthwise conv1d before a linear-attention or state-space recurrence (Qwen3-Next's
Gated DeltaNet, Mamba-2), op type ``causal_conv1d``: its Definitions
``causal_conv1d_{decode,prefill}_c{channels}_w{width}_silu`` (channels per rank; ``..._silu_bias``
with a bias per channel, as Mamba-2 has), the calls a layer makes of them in a step, and their
PyTorch baselines.

flashinfer-trace has no Definition of it; these follow its manner and the engines' kernels
(``causal_conv1d_update`` for a step of one-token requests, ``causal_conv1d_fn`` for a step with
prefills, which takes the step's decode requests with it as sequences of one token). The conv
state is a paged cache of ``state_cache_size`` slots, channels first, as the engines keep it; each
request's slot (``conv_state_indices``) and, in prefill, whether it continues from that slot
(``has_initial_state``) are kept as workload tensors, as the query starts (``cu_seqlens``) are.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

KEY = "causal_conv1d"

#: the Definitions' templates by kind and bias (Qwen3-Next and Nemotron-H-8B at TP=1), instantiated
#: for other channels and widths
_TEMPLATES = {("decode", False): "causal_conv1d_decode_c8192_w4_silu",
              ("prefill", False): "causal_conv1d_prefill_c8192_w4_silu",
              ("decode", True): "causal_conv1d_decode_c10240_w4_silu_bias",
              ("prefill", True): "causal_conv1d_prefill_c10240_w4_silu_bias"}
#: the activations the Definitions apply (named last in their names)
ACTIVATIONS = ("silu",)

#: a kept tensor, or how to make it (a device tensor gathered only for a workload the recorder keeps)
Kept = Union[torch.Tensor, Callable[[], torch.Tensor]]


def layer_problem(activation: Optional[str], dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why a layer's causal conv1d (its ``activation``; its activations' ``dtype`` where known) is
    no ``causal_conv1d_*`` Definition's, or None. With a bias or without, there is one."""
    if activation not in ACTIVATIONS:
        return f"causal conv1d with activation {activation!r} (the causal_conv1d Definitions apply {', '.join(ACTIVATIONS)})"
    if dtype is not None and schema_dtype(dtype) is not DType.bfloat16:
        return f"causal conv1d on {dtype} activations (the causal_conv1d Definitions take bfloat16)"
    return None


def _definition(kind: str, channels: int, width: int, activation: str, bias: bool):
    name = f"causal_conv1d_{kind}_c{channels}_w{width}_{activation}" + ("_bias" if bias else "")
    return cached_definition((KEY, kind, channels, width, activation, bias), lambda: definition_for(
        _TEMPLATES[kind, bias], name, {"channels": channels, "width": width, "state_len": width - 1}, DType.bfloat16))


def decode_call(channels: int, width: int, activation: str, slots: int, decodes: int,
                conv_state_indices: Kept, bias: bool = False) -> KernelCall:
    """``decodes`` one-token requests: one ``causal_conv1d_update`` over them, against a cache of
    ``slots`` slots (their slots: ``conv_state_indices``), with a ``bias`` per channel or none."""
    return KernelCall(_definition("decode", channels, width, activation, bias),
                      {"batch_size": decodes, "state_cache_size": slots},
                      tensors={"conv_state_indices": conv_state_indices})


def prefill_call(channels: int, width: int, activation: str, slots: int, cu_seqlens: torch.Tensor,
                 conv_state_indices: Kept, has_initial_state: Kept, bias: bool = False) -> KernelCall:
    """One ``causal_conv1d_fn`` over requests whose query starts from 0 are ``cu_seqlens`` (host),
    against a cache of ``slots`` slots, with a ``bias`` per channel or none."""
    starts = cu_seqlens.to(torch.int32)
    return KernelCall(_definition("prefill", channels, width, activation, bias),
                      {"total_seq_len": int(starts[-1]), "num_seqs": len(starts) - 1, "len_cu_seqlens": len(starts),
                       "state_cache_size": slots},
                      tensors={"cu_seqlens": starts, "conv_state_indices": conv_state_indices,
                               "has_initial_state": has_initial_state})


#: where vLLM's kernels live (Triton: CUDA only)
_VLLM_CONV1D = "vllm.model_executor.layers.mamba.ops.causal_conv1d"


#: SGLang's copy of them (0.5.x)
_SGLANG_CONV1D = "sglang.kernels.ops.mamba.causal_conv1d_triton"


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """The engines' Triton kernels, in place as the engines call them (a bias where the Definition
    has one): both update the requests' slots of ``conv_state``; vLLM's decode writes its output
    over ``x``, SGLang's returns a new one."""
    state = {"conv_state": "new_conv_state"}
    if definition.name.startswith("causal_conv1d_decode_"):
        return [Native("vllm", "vllm_causal_conv1d_decode.py", requires=_VLLM_CONV1D,
                       overwrites=lambda d: {"x": "output", **state}),
                Native("sglang", "sglang_causal_conv1d_decode.py", requires=_SGLANG_CONV1D, overwrites=lambda d: state)]
    return [Native("vllm", "vllm_causal_conv1d_prefill.py", requires=_VLLM_CONV1D, overwrites=lambda d: state),
            Native("sglang", "sglang_causal_conv1d_prefill.py", requires=_SGLANG_CONV1D, overwrites=lambda d: state)]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=(KEY,),
    templates=tuple(_TEMPLATES.values()),
    baselines=(Baseline("torch_causal_conv1d_decode.py"),
               # one depthwise conv per sequence, as many as the step has: not compiled
               Baseline("torch_causal_conv1d_prefill.py", compiled=False)),
    natives=_natives,
    engine_kernel=engine_kernels.engine_triton("causal_conv1d_update / causal_conv1d_fn", engines=("vLLM", "SGLang")),
    # the engines' Triton (vLLM's, SGLang's) and CUDA (causal-conv1d's) kernels
    kernel_words=("causal_conv1d", "conv1d"),
    slot_inputs=("conv_state_indices",),
)
