"""Concrete inputs for one workload: captured tensors where present, synthesis for the rest."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors import safe_open

from fi_profile.families import family_of
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
    axes = compact_slots(definition, compact_pages(definition, dict(workload.axes), given), given)
    return synthesize_inputs(definition, axes, device=device, seed=seed, given=given, scalars=scalars)


def compact_pages(definition: Definition, axes: dict[str, int], given: dict[str, Any]) -> dict[str, int]:
    """A paged workload's pages renumbered from 0 in their order, and ``num_pages`` the pages it
    uses: a capture's ``num_pages`` is the engine's whole KV cache (tens of GB on a GPU), of which a
    kernel reads or writes only the pages its captured ``kv_indices`` / ``slot_mapping`` name.
    Changes ``given``'s index tensors in place; returns the axes to replay with."""
    if "num_pages" not in definition.var_axes or not ({"kv_indices", "slot_mapping"} & set(given)):
        return axes
    page_size = int(definition.axis_values(axes).get("page_size", 1))
    indices = given.get("kv_indices")
    slots = given.get("slot_mapping")
    used = []
    if isinstance(indices, torch.Tensor):
        used.append(indices.to(torch.int64).flatten())
    if isinstance(slots, torch.Tensor):
        slots = slots.to(torch.int64)
        used.append(torch.div(slots[slots >= 0], page_size, rounding_mode="floor"))
    pages = torch.unique(torch.cat(used)) if used else torch.empty(0, dtype=torch.int64)
    if not len(pages) or len(pages) >= axes.get("num_pages", 0):
        return axes
    if isinstance(indices, torch.Tensor):
        given["kv_indices"] = torch.searchsorted(pages, indices.to(torch.int64)).to(indices.dtype)
    if isinstance(slots, torch.Tensor):
        written = slots >= 0
        renumbered = torch.searchsorted(pages, torch.div(slots, page_size, rounding_mode="floor").clamp(min=0))
        given["slot_mapping"] = torch.where(written, renumbered * page_size + slots % page_size, slots).to(
            given["slot_mapping"].dtype)
    return {**axes, "num_pages": len(pages)}


#: the leading axis of a recurrent layer's state cache (conv states, SSM states)
STATE_CACHE = "state_cache_size"


def compact_slots(definition: Definition, axes: dict[str, int], given: dict[str, Any]) -> dict[str, int]:
    """A recurrent layer's workload with the state-cache slots it uses renumbered 1, 2, ... in their
    order, and ``state_cache_size`` one more than they: a capture's cache is the engine's whole
    state pool (on a GPU, a conv cache of 200k slots: 10 GiB), of which a kernel reads and writes
    only its requests' slots (its family's :attr:`~fi_profile.families.family.Family.slot_inputs`;
    -1 skips a request). Slot 0 stays unused, as in vLLM's pool (its null block). Changes
    ``given``'s slot tensors in place; returns the axes to replay with."""
    family = family_of(definition.op_type)
    names = [name for name in (family.slot_inputs if family is not None else ())
             if isinstance(given.get(name), torch.Tensor)]
    if STATE_CACHE not in definition.var_axes or not names:
        return axes
    slots = {name: given[name].to(torch.int64) for name in names}
    used = torch.unique(torch.cat([s[s >= 0].flatten() for s in slots.values()]))
    if len(used) + 1 >= axes.get(STATE_CACHE, 0):
        return axes
    for name, s in slots.items():
        given[name] = torch.where(s >= 0, torch.searchsorted(used, s.clamp(min=0)) + 1, s).to(given[name].dtype)
    return {**axes, STATE_CACHE: len(used) + 1}
