"""Concrete inputs for one workload: captured tensors where present, synthesis for the rest."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors import safe_open

from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import torch_dtype
from fi_profile.schema.workload import SafetensorsInput, ScalarInput, Workload
from fi_profile.synthesis import synthesize_inputs


def load_captured(root: Path, source: SafetensorsInput) -> Optional[torch.Tensor]:
    """The captured tensor, or None (with a warning) when its file is not there."""
    path = root / source.path
    if not path.is_file():
        warnings.warn(f"{path} is missing; synthesising the input instead", stacklevel=2)
        return None
    with safe_open(str(path), framework="pt") as blob:
        if source.tensor_key not in blob.keys():
            raise KeyError(f"{path}: no tensor {source.tensor_key!r} (has {sorted(blob.keys())})")
        return blob.get_tensor(source.tensor_key)


def workload_inputs(
    definition: Definition,
    workload: Workload,
    root: Path,
    *,
    device: Union[str, torch.device] = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    given: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    for name, source in workload.inputs.items():
        spec = definition.inputs[name]
        if isinstance(source, ScalarInput):
            if spec.shape is None:
                scalars[name] = source.value
            else:  # a 0-D tensor given by value
                given[name] = torch.tensor(source.value, dtype=torch_dtype(spec.dtype))
        elif isinstance(source, SafetensorsInput):
            tensor = load_captured(root, source)
            if tensor is not None:
                given[name] = tensor
    return synthesize_inputs(
        definition, workload.axes, device=device, seed=seed, given=given, scalars=scalars
    )
