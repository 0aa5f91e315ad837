"""Tensor element types of the seed-002 schema and their torch counterparts."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class DType(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float8_e4m3fn = "float8_e4m3fn"
    float8_e5m2 = "float8_e5m2"
    float4_e2m1 = "float4_e2m1"
    int64 = "int64"
    int32 = "int32"
    int16 = "int16"
    int8 = "int8"
    bool = "bool"

    @property
    def is_float(self) -> bool:
        return self.value.startswith("float") or self.value == "bfloat16"

    @property
    def is_packed(self) -> bool:
        """float4_e2m1 is stored two values per byte (torch.float4_e2m1fn_x2) along the last dim."""
        return self is DType.float4_e2m1


#: Spellings of the older seed-001 schema that name a seed-002 dtype.
DTYPE_ALIASES = {"float8_e4m3": DType.float8_e4m3fn}


def parse_dtype(value: Any) -> Any:
    """Pydantic before-validator: accept the seed-001 aliases."""
    if isinstance(value, str) and value in DTYPE_ALIASES:
        return DTYPE_ALIASES[value]
    return value


_TO_TORCH: dict[DType, "torch.dtype"] = {}
_FROM_TORCH: dict["torch.dtype", DType] = {}


def torch_dtype(dtype: DType) -> "torch.dtype":
    if not _TO_TORCH:
        import torch

        _TO_TORCH.update(
            {
                DType.float32: torch.float32,
                DType.float16: torch.float16,
                DType.bfloat16: torch.bfloat16,
                DType.float8_e4m3fn: torch.float8_e4m3fn,
                DType.float8_e5m2: torch.float8_e5m2,
                DType.float4_e2m1: torch.float4_e2m1fn_x2,
                DType.int64: torch.int64,
                DType.int32: torch.int32,
                DType.int16: torch.int16,
                DType.int8: torch.int8,
                DType.bool: torch.bool,
            }
        )
        _FROM_TORCH.update({t: d for d, t in _TO_TORCH.items()})
    return _TO_TORCH[dtype]


def schema_dtype(dtype: "torch.dtype") -> DType:
    """The schema dtype of a torch dtype; raises ValueError for types the schema cannot express."""
    torch_dtype(DType.float32)  # fills both tables once
    found = _FROM_TORCH.get(dtype)
    if found is None:
        raise ValueError(f"torch dtype {dtype} has no counterpart in the Definition schema")
    return found
