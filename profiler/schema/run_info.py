"""The ``run`` block of a Kernel Calling Record (fi-profile's addition to seed 001): how the run
was made and what the record holds or misses. Readers of the seed format can ignore it; like every
other document here, an unknown field is an error. Completeness is decided over it in one place,
:func:`fi_profile.capture.completeness.judge`.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field, NonNegativeInt

from fi_profile.schema.base import StrictModel


class StepCounts(StrictModel):
    """Engine steps: learned (recorded call by call), replayed (counted as a learned step of the
    same shape), ``engine`` (steps that ran the model's forward, every rank's), and compiled-forward
    runs by how they ran (compiled, piecewise_cuda_graph, full_cuda_graph)."""

    learned: Optional[NonNegativeInt] = None
    replayed: Optional[NonNegativeInt] = None
    engine: Optional[NonNegativeInt] = None
    compiled_forward: Optional[dict[str, NonNegativeInt]] = None


class PaddedTokens(StrictModel):
    """Compiled-forward runs with ``ran_with`` tokens (padded, for a CUDA graph) for ``scheduled``."""

    ran_with: NonNegativeInt
    scheduled: NonNegativeInt
    runs: NonNegativeInt


class DefinitionKernelTime(StrictModel):
    """The engine's kernel time attributed to one Definition: ``ms`` over the run, the kernel
    launches (on CPU: operators) it was measured over, the kernels' names, and the Definitions it
    was measured together with where one kernel computed several (``shared_with``)."""

    ms: float
    calls: NonNegativeInt
    kernels: list[str]
    shared_with: Optional[list[str]] = None
    #: the GPU's SM clock its kernels ran at, weighed by their time (NVML, sampled; None: not sampled)
    sm_clock_mhz: Optional[float] = None


class UnattributedKernel(StrictModel):
    name: str
    calls: NonNegativeInt
    ms: float
    share: float


class EngineKernels(StrictModel):
    """What the engine's kernels took over the recorded steps, attributed to Definitions
    (:mod:`fi_profile.capture.kernel_accounting`). ``device``: ``cuda`` (kernels, from CUPTI) or
    ``cpu`` (the operators the engine called, with those they called); ``required_share``: the
    attributed share below which the record is incomplete (on GPUs; on CPU the share is reported,
    not required). ``total_ms`` is everything the engine ran; where each step's model forward
    was seen whole (a forward range or a graph run), what the engine launched outside every
    forward and hooked call is its own work (``engine_work``: its step's input preparation,
    attention metadata, output copies), and ``attributed_share`` and each unattributed kernel's
    ``share`` are of the rest, the model's; ``engine_work_ms`` None: not told apart (all of it the
    model's)."""

    device: str
    steps: NonNegativeInt
    total_ms: float
    attributed_share: float
    by_definition: dict[str, DefinitionKernelTime]
    unattributed: list[UnattributedKernel]
    required_share: Optional[float] = None
    #: seconds the engine's processes spent attributing the profile after the run (summed)
    processing_s: Optional[float] = None
    #: the GPU's SM clock the kernels ran at, weighed by their time, and the share of their time
    #: the GPU held its clock down for power or heat (NVML, sampled; None: not sampled)
    sm_clock_mhz: Optional[float] = None
    clock_limited_share: Optional[float] = None
    #: the engine's own work outside the model's forwards, and its largest kernels (share: of ``total_ms``)
    engine_work_ms: Optional[float] = None
    engine_work: Optional[list[UnattributedKernel]] = None


class UnkeptWorkload(StrictModel):
    """A shape a Definition's calls had that the capture did not write as a workload."""

    axes: dict[str, int]
    count: int = Field(ge=1)


class RunInfo(StrictModel):
    # how the run was made
    engine: Optional[str] = None  # "vllm 0.32.0"
    eager: Optional[bool] = None
    cuda_graphs_and_torch_compile: Optional[bool] = None
    weights: Optional[str] = None  # "dummy (random)", or the load format
    dtype: Optional[str] = None
    tensor_parallel: Optional[NonNegativeInt] = None
    attention_backend: Optional[str] = None
    scenario: Optional[dict[str, Union[int, float, None]]] = None
    #: hook points this engine version lacks (whatever they record is not in the record)
    hooks_missing: Optional[list[str]] = None
    #: layers whose kernels no hook records, by kind -> layers
    not_covered: Optional[dict[str, NonNegativeInt]] = None
    #: layers recorded at other shapes than their kernels ran, by kind -> layers
    inexact: Optional[dict[str, NonNegativeInt]] = None
    #: with dummy weights, in a MoE model: the biases zeroed before the run, so that the routing
    #: spreads over the experts as a trained model's does (fi_profile.capture.dummy_routing)
    dummy_biases_zeroed: Optional[NonNegativeInt] = None
    engine_args: Optional[dict[str, Any]] = None
    count_only: Optional[bool] = None
    # what the engine's processes recorded
    processes: Optional[NonNegativeInt] = None
    hook_errors: Optional[dict[str, NonNegativeInt]] = None
    steps: Optional[StepCounts] = None
    #: the steps in order: [tokens, requests, decoding, prefilling, consecutive steps]
    schedule: Optional[list[list[NonNegativeInt]]] = None
    #: how each Definition's calls ran: "eager", "compiled", "cuda_graph" (joined with " and ")
    execution: Optional[dict[str, str]] = None
    padded_tokens: Optional[list[PaddedTokens]] = None
    #: per hook op (an op family's key): invocations whose calls are unknown (their hook failed)
    calls_lost: Optional[dict[str, NonNegativeInt]] = None
    #: per hook op: the recorded Definitions whose counts are therefore low
    affected_definitions: Optional[dict[str, list[str]]] = None
    #: the engine's own kernel time over the recorded steps, attributed to Definitions
    engine_kernels: Optional[EngineKernels] = None
    #: per Definition, the shapes its calls had beyond those written as workloads (the capture's
    #: ``--max-workloads``), each with how often it was seen: its calls' spread, which the projection
    #: weighs (estimating their times by input size) though they cannot be replayed
    unkept_workloads: Optional[dict[str, list[UnkeptWorkload]]] = None
    #: what the record misses, in words; absent when it is complete
    incomplete: Optional[str] = None
