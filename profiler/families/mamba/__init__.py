"""Mamba-2's selective state space layer (Nemotron-H, Granite-4, Falcon-H1), op types ``mamba_ssu``
and ``mamba_ssd``: flashinfer-trace's ``mamba_ssu_decode_h{H}_d{D}_s{S}_ng{G}`` (the selective
state update of one-token requests against a paged state cache, heads and groups per rank) and our
``mamba_ssd_prefill_h{H}_d{D}_s{S}_ng{G}`` (the same recurrence over sequences of several lengths,
``cu_seqlens``, which the engines compute as the chunked SSD scan), the calls a layer makes of them
in a step, their PyTorch baselines, and the inputs the recurrence needs to stay what a model feeds it.

Both take the gates as the engines' kernels take them: ``dt`` raw (softplus of ``dt + dt_bias``
is the step), ``A`` the decay rate, negative (``-exp(A_log)``), ``D`` the skip. The decode call
takes them broadcast over the head's dimensions (the dataset's interface: ``A`` is
``[nheads, head_dim, dstate]``), the prefill call one per head. The state is an input and the new
state an output, in bfloat16 as the dataset's, or in float32 (``..._state_float32``: vLLM keeps
Nemotron-H's so, ``mamba_ssm_cache_dtype``); the requests' slots (``state_batch_indices``, ``state_indices``), and in prefill
whether a request continues from its slot (``has_initial_state``), are kept as workload tensors.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

KEY = "mamba"

#: flashinfer-trace's Nemotron-H-8B decode at TP=1, and our prefill of the same layer
_TEMPLATES = {"decode": "mamba_ssu_decode_h128_d64_s128_ng8", "prefill": "mamba_ssd_prefill_h128_d64_s128_ng8"}
_OP_TYPES = {"decode": "mamba_ssu", "prefill": "mamba_ssd"}
#: the inputs of the Definitions' parameters and the dtypes they give them
PARAMETER_DTYPES = {"A": DType.float32, "D": DType.bfloat16, "dt_bias": DType.bfloat16}
#: the state caches' dtypes a Definition keeps (the dataset's bfloat16; float32 named in the name)
STATE_DTYPES = (DType.bfloat16, DType.float32)

#: the decay rate -A = exp(A_log) and the step softplus(dt_bias) Mamba-2 is initialized with:
#: A ~ U(1, 16), dt log-uniform in [1e-3, 1e-1] (Gated DeltaNet follows it)
A_RANGE = (1.0, 16.0)
DT_RANGE = (1e-3, 1e-1)

#: a kept tensor, or how to make it (a device tensor gathered only for a workload the recorder keeps)
Kept = Union[torch.Tensor, Callable[[], torch.Tensor]]


def _per_head(shape: tuple[int, ...], values: torch.Tensor) -> torch.Tensor:
    """``values`` (one per head, the first dimension) broadcast over the rest of ``shape``."""
    return values.view(-1, *([1] * (len(shape) - 1))).expand(shape).contiguous()


def input_values(name: str, shape: tuple[int, ...], definition: Definition, gen: torch.Generator,
                 device: torch.device, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The gates a trained layer has, one value per head (the decode Definition's broadcast over
    the head's dimensions as the engines pass them): ``A`` in -[1, 16], ``dt_bias`` the softplus
    inverse of a step in [1e-3, 1e-1], ``D`` about 1. ``dt`` (a projection) stays normal and
    small, and the state of unit scale; None for the rest."""
    heads = shape[0] if shape else 0
    if name == "A":
        low, high = A_RANGE
        rates = low + (high - low) * torch.rand(heads, generator=gen, device=device)
        return _per_head(shape, -rates).to(dtype)
    if name == "dt_bias":
        low, high = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
        step = torch.exp(low + (high - low) * torch.rand(heads, generator=gen, device=device))
        return _per_head(shape, step + torch.log(-torch.expm1(-step))).to(dtype)
    if name == "D":
        return _per_head(shape, 1.0 + 0.1 * torch.randn(heads, generator=gen, device=device)).to(dtype)
    if name == "dt":
        return (0.5 * torch.randn(shape, generator=gen, device=device)).to(dtype)
    return None


def layer_problem(heads: int, groups: int, activation_dtype: Optional[torch.dtype] = None,
                  state_dtype: Optional[torch.dtype] = None,
                  parameter_dtypes: Optional[dict[str, torch.dtype]] = None) -> Optional[str]:
    """Why a Mamba-2 layer of these sizes (per rank; its activations', state's and parameters'
    dtypes where known) is no ``mamba_*`` Definition's, or None."""
    if not groups or heads % groups:
        return f"Mamba-2 with {heads} heads over {groups} groups per rank (not a whole number per group)"
    if activation_dtype is not None and schema_dtype(activation_dtype) is not DType.bfloat16:
        return f"Mamba-2 on {activation_dtype} activations (the mamba Definitions take bfloat16)"
    if state_dtype is not None and schema_dtype(state_dtype) not in STATE_DTYPES:
        return (f"Mamba-2 with a {state_dtype} state cache (mamba_ssm_cache_dtype; the mamba Definitions keep "
                f"{' or '.join(d.value for d in STATE_DTYPES)})")
    for name, dtype in (parameter_dtypes or {}).items():
        if schema_dtype(dtype) is not PARAMETER_DTYPES[name]:
            return f"Mamba-2 with its {name} in {dtype} (the mamba Definitions take {PARAMETER_DTYPES[name].value})"
    return None


def _definition(kind: str, heads: int, head_dim: int, state: int, groups: int, state_dtype: torch.dtype) -> Definition:
    kept = schema_dtype(state_dtype)
    if kept not in STATE_DTYPES:
        raise NotImplementedError(f"Mamba-2 with a {state_dtype} state cache: no mamba Definition keeps it")
    name = f"{_OP_TYPES[kind]}_{kind}_h{heads}_d{head_dim}_s{state}_ng{groups}" + (
        "" if kept is DType.bfloat16 else f"_state_{kept.value}")
    states = {"state": kept, "new_state": kept}
    return cached_definition((KEY, kind, heads, head_dim, state, groups, kept), lambda: definition_for(
        _TEMPLATES[kind], name, {"nheads": heads, "head_dim": head_dim, "dstate": state, "ngroups": groups},
        DType.bfloat16, input_dtypes={"A": DType.float32, **states}))


def decode_call(heads: int, head_dim: int, state: int, groups: int, slots: int, decodes: int,
                state_batch_indices: Kept, state_dtype: torch.dtype = torch.bfloat16) -> KernelCall:
    """``decodes`` one-token requests: one selective state update over them, against a cache of
    ``slots`` slots of ``state_dtype`` (their slots: ``state_batch_indices``)."""
    return KernelCall(_definition("decode", heads, head_dim, state, groups, state_dtype),
                      {"batch_size": decodes, "state_cache_size": slots},
                      tensors={"state_batch_indices": state_batch_indices})


def prefill_call(heads: int, head_dim: int, state: int, groups: int, slots: int, cu_seqlens: torch.Tensor,
                 state_indices: Kept, has_initial_state: Kept, state_dtype: torch.dtype = torch.bfloat16) -> KernelCall:
    """One chunked scan over requests whose query starts from 0 are ``cu_seqlens`` (host), against
    a cache of ``slots`` slots of ``state_dtype``: each starts from its slot's state or from zeros, and leaves its
    last state there."""
    starts = cu_seqlens.to(torch.int32)
    return KernelCall(_definition("prefill", heads, head_dim, state, groups, state_dtype),
                      {"total_seq_len": int(starts[-1]), "num_seqs": len(starts) - 1, "len_cu_seqlens": len(starts),
                       "state_cache_size": slots},
                      tensors={"cu_seqlens": starts, "state_indices": state_indices,
                               "has_initial_state": has_initial_state})


def _chunked(definition: Definition) -> bool:
    return definition.op_type == "mamba_ssd"


def _output_read_from_state(definition: Definition) -> dict[str, str]:
    """The chunked scan reads each chunk's output from its chunk-start state cast to the
    activations' dtype (``C prev_states``): the output's rounding is the state's magnitude's, where
    larger than its own."""
    return {"output": "new_state"} if _chunked(definition) else {}


def _rounds_through(definition: Definition) -> Optional[torch.dtype]:
    """The chunked SSD scan (vLLM's, SGLang's, mamba_ssm's) multiplies each chunk's ``C B^T`` (and
    its previous state) with the inputs in their dtype: it rounds those products to the activations'
    dtype before summing up to a chunk's worth of them, where the reference's token-by-token
    recurrence keeps them in float32. The activations' precision times the output's largest
    magnitude bounds its check (``atol_of_largest``); a decode step (the selective state update) is
    float32 throughout. Seen on an H200: vLLM 0.26's scan 0.031 off at bfloat16's 0.01 for 0.014% of
    Nemotron-H-8B's outputs."""
    if not _chunked(definition):
        return None
    spec = definition.inputs.get("x")
    return torch.float16 if spec is not None and spec.dtype is DType.float16 else torch.bfloat16


#: where vLLM's kernels live (Triton: CUDA only)
_VLLM_SSM = "vllm.model_executor.layers.mamba.ops.mamba_ssm"


_VLLM_SSD = "vllm.model_executor.layers.mamba.ops.ssd_combined"


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """vLLM's Triton kernels, in place on the state as the engine calls them: the selective state
    update, and the chunked SSD scan (its chunk metadata built in the call)."""
    if definition.op_type == "mamba_ssu":
        return [Native("vllm", "vllm_mamba_ssu_decode.py", requires=_VLLM_SSM, overwrites=lambda d: {"state": "new_state"})]
    return [Native("vllm", "vllm_mamba_ssd_prefill.py", requires=_VLLM_SSD, overwrites=lambda d: {"state": "new_state"})]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=tuple(_OP_TYPES.values()),
    templates=tuple(_TEMPLATES.values()),
    baselines=(Baseline("torch_mamba_ssu_decode.py", op_type="mamba_ssu"),
               # a Python loop over the positions, as many as the longest sequence: not compiled
               Baseline("torch_mamba_ssd_prefill.py", op_type="mamba_ssd", compiled=False)),
    # vLLM's and SGLang's Triton kernels (selective_state_update, the SSD scan's chunk kernels) and
    # FlashInfer's: never a GEMM's
    kernel_words=("selective_scan", "selective_state", "chunk_scan", "chunk_state", "chunk_cumsum", "state_passing",
                  "bmm_chunk", "mamba", "ssd"),
    # the chunked scan returns each sequence's last state by a gather (``states[last_chunk_indices]``),
    # which vLLM's mixer scatters into the state cache (``ssm_state[state_indices] = ...``): the
    # Definition's own work, its state cache being its input and output
    tail_words=("gather", "index_put"),
    natives=_natives,
    atol_of_largest=_chunked,
    atol_scaled_by=_output_read_from_state,
    rounds_through=_rounds_through,
    engine_kernel=engine_kernels.engine_triton("selective state update / chunked scan kernels"),
    input_values=input_values,
    slot_inputs=("state_batch_indices", "state_indices"),
)
