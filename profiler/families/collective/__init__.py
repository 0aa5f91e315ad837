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

from typing import Any, Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.families.family import EngineKernel, EngineRun, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "collective"


def all_reduce_call(x: torch.Tensor, ranks: int) -> Optional[KernelCall]:
    """An all-reduce (sum) of ``x`` over its last dimension's rows among ``ranks`` GPUs (None for
    one: the engines return the tensor untouched)."""
    if ranks <= 1:
        return None
    hidden = x.shape[-1]

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for("all_reduce_r2_h4096", f"all_reduce_r{ranks}_h{hidden}{dtype_suffix(dtype)}",
                              {"num_ranks": ranks, "hidden_size": hidden}, dtype)

    definition = cached_definition(("all_reduce", ranks, hidden, x.dtype), build)
    return KernelCall(definition, {"num_tokens": rows(x, hidden)})


def fused_add_rmsnorm_call(x: torch.Tensor, residual: torch.Tensor, eps: float, ranks: int) -> Optional[KernelCall]:
    """An all-reduce of ``x`` fused with the residual add and RMSNorm after it (one kernel)."""
    if ranks <= 1:
        return None
    hidden = x.shape[-1]

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for("all_reduce_fused_add_rmsnorm_r2_h4096",
                              f"all_reduce_fused_add_rmsnorm_r{ranks}_h{hidden}{dtype_suffix(dtype)}",
                              {"num_ranks": ranks, "hidden_size": hidden}, dtype, {"EPS": eps})

    definition = cached_definition(("all_reduce_fused_add_rmsnorm", ranks, hidden, x.dtype, eps), build)
    return KernelCall(definition, {"num_tokens": rows(x, hidden)})


def all_gather_call(x: torch.Tensor, ranks: int, dim: int = -1) -> Optional[KernelCall]:
    """An all-gather of ``x`` among ``ranks`` GPUs along its last dimension (the one the engines
    gather logits along); along another it raises (no Definition computes it)."""
    if ranks <= 1:
        return None
    if dim not in (-1, x.dim() - 1):
        raise NotImplementedError(f"all-gather along dimension {dim} of a {x.dim()}-D tensor: no Definition "
                                  "computes it (only along the last)")
    shard = x.shape[-1]

    def build() -> Definition:
        dtype = schema_dtype(x.dtype)
        return definition_for("all_gather_r2_n64128", f"all_gather_r{ranks}_n{shard}{dtype_suffix(dtype)}",
                              {"num_ranks": ranks, "shard_size": shard, "gathered_size": ranks * shard}, dtype)

    definition = cached_definition(("all_gather", ranks, shard, x.dtype), build)
    return KernelCall(definition, {"num_tokens": rows(x, shard)})


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
    templates=("all_reduce_r2_h4096", "all_reduce_fused_add_rmsnorm_r2_h4096", "all_gather_r2_n64128"),
    engine_kernel=_engine_kernel,
    # NCCL's ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``, vLLM's and SGLang's custom all-reduce
    # (``cross_device_reduce_1stage``), symmetric-memory ones (``multimem_all_reduce_kernel``),
    # FlashInfer's fused one (``allreduce_fusion_kernel_oneshot_lamport``)
    op_kernel_words={"all_reduce": ("allreduce", "all_reduce", "cross_device_reduce", "allreduce_fusion", "lamport"),
                     "all_gather": ("allgather", "all_gather")},
    not_replayed="a collective among GPUs: its time is the interconnect's, which one GPU cannot replay",
)
