"""A workload's size: the elements its inputs hold, what a kernel's time grows with. The
projection estimates the time of a workload a replay did not run from it; a replay compiles a
``torch.compile``'d solution first on its Definition's largest workload by it."""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

from fi_profile.schema import Definition, Workload


def input_size(definition: Definition, axes: Mapping[str, int]) -> float:
    """The elements a workload's inputs hold (its ``axes``). An input sized by the KV cache's
    pages counts the pages the workload reads (``num_kv_indices``), not the whole cache (the same
    for every workload of a capture), or not at all where the Definition does not say which pages
    it reads."""
    values = definition.axis_values(dict(axes))
    read = values.get("num_kv_indices")
    size = 0
    for spec in definition.inputs.values():
        if spec.shape is None:
            continue
        if "num_pages" in spec.shape:
            if read is None:
                continue
            shape = definition.shape_of(spec, {**values, "num_pages": read})
        else:
            shape = definition.shape_of(spec, values)
        size += math.prod(shape) if shape else 1
    return float(size)


def largest(definition: Definition, workloads: Sequence[Workload]) -> Optional[Workload]:
    """The workload whose inputs hold the most elements (the first of equals), None for none."""
    return max(workloads, key=lambda w: input_size(definition, w.axes), default=None)
