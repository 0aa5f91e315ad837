"""Pydantic models of every document fi-profile reads or writes, one concept per module."""

from profiler.schema.agent_trace import AgentConversation, AgentTrace
from profiler.schema.benchmark_result import BenchmarkResult
from profiler.schema.calling_record import Framework, KernelCallingRecord, KernelCount
from profiler.schema.definition import AxisConst, AxisVar, Definition, TensorSpec
from profiler.schema.dtype import DType, schema_dtype, torch_dtype
from profiler.schema.legacy import LegacyKernelDescription
from profiler.schema.solution import Language, Solution
from profiler.schema.workload import Trace, Workload

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
