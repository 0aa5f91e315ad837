"""Pydantic models of every document fi-profile reads or writes, one concept per module."""

from fi_profile.schema.agent_trace import AgentConversation, AgentTrace
from fi_profile.schema.benchmark_result import BenchmarkResult
from fi_profile.schema.calling_record import Framework, KernelCallingRecord, KernelCount
from fi_profile.schema.definition import AxisConst, AxisVar, Definition, TensorSpec
from fi_profile.schema.dtype import DType, schema_dtype, torch_dtype
from fi_profile.schema.legacy import LegacyKernelDescription
from fi_profile.schema.solution import Language, Solution
from fi_profile.schema.workload import Trace, Workload

__all__ = [
    "AgentConversation",
    "AgentTrace",
    "AxisConst",
    "AxisVar",
    "BenchmarkResult",
    "DType",
    "Definition",
    "Framework",
    "KernelCallingRecord",
    "KernelCount",
    "Language",
    "LegacyKernelDescription",
    "Solution",
    "TensorSpec",
    "Trace",
    "Workload",
    "schema_dtype",
    "torch_dtype",
]
