"""Per-process recorder of kernel calls, kept cheap on the hot path.

Every hook hands its calls to the process's :data:`RECORDER`. Recording costs a dict increment
per call; index tensors are copied only the first time a (definition, axes) pair is seen. Nothing
is recorded until the driver starts the model phase, so engine start-up (memory profiling,
warm-up, graph capture) stays out of the record. ``flush`` writes this process's part file
atomically; ``profiler.capture.output`` merges the parts of all processes.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

import torch
from safetensors.torch import save_file

from profiler.capture.ops import KernelCall
from profiler.schema.definition import Definition

#: per-process parts and their tensors, hidden so the output folder holds only documents
PARTS_DIR = ".fi-profile/parts"


class Recorder:
    def __init__(self) -> None:
        self.active = False
        self.count_only = False  # count calls per Definition, keep no workloads
        self.page_size: Optional[int] = None
        self.num_pages: Optional[int] = None
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.calls: Counter[str] = Counter()
        self.workloads: Counter[tuple[str, tuple[tuple[str, int], ...]]] = Counter()
        self.definitions: dict[str, Definition] = {}
        self.samples: dict[tuple[str, tuple[tuple[str, int], ...]], KernelCall] = {}
        self.errors: Counter[str] = Counter()

    def record(self, calls: Iterable[Optional[KernelCall]]) -> None:
        with self._lock:
            for call in calls:
                if call is None:
                    continue
                name = call.definition.name
                self.calls[name] += 1
                if name not in self.definitions:
                    self.definitions[name] = call.definition
                if self.count_only:
                    continue
                key = (name, tuple(call.axes.items()))  # op functions build axes in a fixed order
                self.workloads[key] += 1
                if key not in self.samples:
                    call.tensors = {k: v.detach().to("cpu").clone() for k, v in call.tensors.items()}
                    self.samples[key] = call

    def error(self, where: str, exc: BaseException) -> None:
        with self._lock:
            self.errors[f"{where}: {type(exc).__name__}: {exc}"[:300]] += 1

    def flush(self, directory: Path) -> Path:
        """Write this process's part (JSON + blobs) atomically; returns the part file."""
        directory = Path(directory)
        parts = directory / PARTS_DIR
        parts.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        with self._lock:
            blob_rel = Path(PARTS_DIR) / f"{pid}.safetensors"
            blob_tensors: dict[str, torch.Tensor] = {}
            workloads = []
            for i, ((name, axes), count) in enumerate(self.workloads.items()):
                sample = self.samples[(name, axes)]
                keys = {}
                for tname, tensor in sample.tensors.items():
                    key = f"w{i}.{tname}"
                    blob_tensors[key] = tensor.contiguous()
                    keys[tname] = key
                workloads.append(
                    {"definition": name, "axes": dict(axes), "count": count, "tensors": keys, "scalars": sample.scalars}
                )
            part = {
                "pid": pid,
                "calls": dict(self.calls),
                "workloads": workloads,
                "definitions": {n: d.to_dict() for n, d in self.definitions.items()},
                "blob": str(blob_rel) if blob_tensors else None,
                "errors": dict(self.errors),
            }
        if blob_tensors:
            tmp_blob = directory / f"{blob_rel}.tmp"
            save_file(blob_tensors, str(tmp_blob))
            os.replace(tmp_blob, directory / blob_rel)
        path = parts / f"{pid}.json"
        tmp = parts / f"{pid}.json.tmp"
        tmp.write_text(json.dumps(part))
        os.replace(tmp, path)
        return path


RECORDER = Recorder()
