"""Per-process recorder of kernel calls, kept cheap on the hot path.

Every hook hands its calls to the process's :data:`RECORDER`. Recording costs a dict increment
per call; index tensors are copied only the first time a (definition, axes) pair is seen.

Steps repeat: an engine step's calls are a function of its shape (token counts and attention
layout), which the adapter reports at each step boundary as a signature. The first step of a
signature is recorded call by call and its call list learned; a later step with the same
signature is replayed: each hook then only counts (and opens its NVTX range), and the learned
list is added at the step's end. A replayed step whose hooked-call count differs from the learned
one is reported in ``errors``. Without step boundaries every call is recorded in full. Nothing
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
from typing import Hashable, Iterable, Optional

import torch
from safetensors.torch import save_file

from profiler.capture.ops import KernelCall
from profiler.schema.definition import Definition

#: per-process parts and their tensors, hidden so the output folder holds only documents
PARTS_DIR = ".fi-profile/parts"

WorkloadKey = tuple[str, tuple[tuple[str, int], ...]]


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
        self.workloads: Counter[WorkloadKey] = Counter()
        self.definitions: dict[str, Definition] = {}
        self.samples: dict[WorkloadKey, KernelCall] = {}
        self.errors: Counter[str] = Counter()
        #: learned steps: signature -> (call keys, NVTX label of each hooked invocation)
        self.steps: dict[Hashable, tuple[tuple[WorkloadKey, ...], tuple[str, ...]]] = {}
        self.step_stats: Counter[str] = Counter()
        #: while the current step is replayed: the label of each hooked invocation, else None
        self.replay: Optional[tuple[str, ...]] = None
        self.replayed = 0
        self._replay_keys: tuple[WorkloadKey, ...] = ()
        self._learning: Optional[list[WorkloadKey]] = None
        self._learning_labels: list[str] = []
        self._signature: Hashable = None

    def begin_step(self, signature: Hashable) -> None:
        """A step boundary: end the current step and start one of ``signature``."""
        with self._lock:
            nothing_yet = (self.replay is not None and self.replayed == 0) or (
                self._learning is not None and not self._learning_labels
            )
            if nothing_yet:  # a second boundary before any call (several KV-cache groups): same step
                signature = (self._signature, signature)
            else:
                self._commit_step()
            self._signature = signature
            learned = self.steps.get(signature)
            self.replayed = 0
            if learned is None:
                self.replay, self._replay_keys = None, ()
                self._learning, self._learning_labels = [], []
            else:
                self._replay_keys, self.replay = learned
                self._learning = None

    def _commit_step(self) -> None:
        if self.replay is not None:
            if self.replayed != len(self.replay):
                self.errors[
                    f"step replay: {self.replayed} hooked calls where the learned step had {len(self.replay)}; "
                    "counted as learned"
                ] += 1
            for name, axes in self._replay_keys:
                self.calls[name] += 1
                if not self.count_only:
                    self.workloads[(name, axes)] += 1
            self.step_stats["replayed"] += 1
        elif self._learning is not None:
            self.steps[self._signature] = (tuple(self._learning), tuple(self._learning_labels))
            self.step_stats["learned"] += 1
        self.replay, self._replay_keys, self._learning, self._signature = None, (), None, None

    def record(self, calls: Iterable[Optional[KernelCall]], op: str) -> str:
        """Record one hooked invocation's calls; returns its NVTX label (first Definition, or op)."""
        label = op
        with self._lock:
            for call in calls:
                if call is None:
                    continue
                name = call.definition.name
                if label is op:
                    label = name
                self.calls[name] += 1
                if name not in self.definitions:
                    self.definitions[name] = call.definition
                key = (name, tuple(call.axes.items()))  # op functions build axes in a fixed order
                if self._learning is not None:
                    self._learning.append(key)
                if self.count_only:
                    continue
                self.workloads[key] += 1
                if key not in self.samples:
                    call.tensors = {k: v.detach().to("cpu").clone() for k, v in call.tensors.items()}
                    self.samples[key] = call
            if self._learning is not None:
                self._learning_labels.append(label)
        return label

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
            self._commit_step()
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
                "steps": dict(self.step_stats),
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
