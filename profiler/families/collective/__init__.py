"""Collectives among the GPUs of a tensor-parallel group: the all-reduce after a row-parallel
linear layer or a vocabulary-parallel embedding, SGLang's all-reduce fused with the residual add
and RMSNorm after it, and the all-gather of a vocabulary-parallel lm_head's logits. Op types
``all_reduce`` and ``all_gather``; hooked on the engines' ``GroupCoordinator`` (and SGLang's fused
kernels), so that a multi-GPU run's communication kernels are in the record, counted and
accounted for, instead of left over.

A Definition of the family takes every rank's tensor (``rank_inputs``, ``[num_ranks, ...]``) and
gives what each rank holds afterwards. Its reference says what the collective computes; its time
is the interconnect's, which one GPU cannot replay, so the replay runs none of them (and says so).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.families.family import EngineKernel, EngineRun, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "collective"


#: each collective's template, and the letter its name gives the width of a rank's tensor with
_TEMPLATES = {
    "all_reduce": ("all_reduce_r2_h4096", "h"),
    "all_reduce_fused_add_rmsnorm": ("all_reduce_fused_add_rmsnorm_r2_h4096", "h"),
    "all_gather": ("all_gather_r2_n64128", "n"),
}


def _call(kind: str, x: torch.Tensor, ranks: int, consts: Mapping[str, int],
          constants: tuple[tuple[str, float], ...] = ()) -> KernelCall:
    """``kind`` of ``x`` (rows of its last dimension's width) among ``ranks`` GPUs."""
    template, letter = _TEMPLATES[kind]
    width = x.shape[-1]

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for(template, f"{kind}_r{ranks}_{letter}{width}{dtype_suffix(dtype)}",
                              {"num_ranks": ranks, **consts}, dtype, dict(constants))

    definition = cached_definition((kind, ranks, width, x.dtype, constants), build)
    return KernelCall(definition, {"num_tokens": rows(x, width)})


def all_reduce_call(x: torch.Tensor, ranks: int) -> Optional[KernelCall]:
    """An all-reduce (sum) of ``x`` among ``ranks`` GPUs (None for one: the engines return the
    tensor untouched)."""
    return _call("all_reduce", x, ranks, {"hidden_size": x.shape[-1]}) if ranks > 1 else None


def fused_add_rmsnorm_call(x: torch.Tensor, residual: torch.Tensor, eps: float, ranks: int) -> Optional[KernelCall]:
    """An all-reduce of ``x`` fused with the residual add and RMSNorm after it (one kernel)."""
    if ranks <= 1:
        return None
    return _call("all_reduce_fused_add_rmsnorm", x, ranks, {"hidden_size": x.shape[-1]}, (("EPS", eps),))


def all_gather_call(x: torch.Tensor, ranks: int, dim: int = -1) -> Optional[KernelCall]:
    """An all-gather of ``x`` among ``ranks`` GPUs along its last dimension (the one the engines
    gather logits along); along another it raises (no Definition computes it)."""
    if ranks <= 1:
        return None
    if dim not in (-1, x.dim() - 1):
        raise NotImplementedError(f"all-gather along dimension {dim} of a {x.dim()}-D tensor: no Definition "
                                  "computes it (only along the last)")
    shard = x.shape[-1]
    return _call("all_gather", x, ranks, {"shard_size": shard, "gathered_size": ranks * shard})


def group_all_reduce_calls(self: Any, input_: torch.Tensor) -> list:
    """``GroupCoordinator.all_reduce`` (vLLM and SGLang alike): among the group's GPUs."""
    return [all_reduce_call(input_, int(self.world_size))]


def group_all_gather_calls(self: Any, input_: torch.Tensor, dim: int = -1) -> list:
    """``GroupCoordinator.all_gather`` (vLLM and SGLang alike): among the group's GPUs."""
    return [all_gather_call(input_, int(self.world_size), int(dim))]


def _engine_kernel(run: EngineRun, definition: Definition) -> EngineKernel:
    return EngineKernel(None, f"{run.framework}'s collective among {definition.const_axes.get('num_ranks')} GPUs, "
                              "which one GPU cannot replay")


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("all_reduce", "all_gather"),
    templates=tuple(template for template, _ in _TEMPLATES.values()),
    engine_kernel=_engine_kernel,
    # NCCL's ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``, vLLM's and SGLang's custom all-reduce
    # (``cross_device_reduce_1stage``), symmetric-memory ones (``multimem_all_reduce_kernel``),
    # FlashInfer's fused one (``allreduce_fusion_kernel_oneshot_lamport``)
    op_kernel_words={"all_reduce": ("allreduce", "all_reduce", "cross_device_reduce", "allreduce_fusion", "lamport"),
                     "all_gather": ("allgather", "all_gather")},
    not_replayed="a collective among GPUs: its time is the interconnect's, which one GPU cannot replay",
)
