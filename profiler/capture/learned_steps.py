"""Steps repeat, and their calls with them: the first step of a signature is learned call by call
(:class:`StepLearning`), a later one of the same signature is replayed (:class:`StepReplay`): each
hooked invocation only counts, and the learned step's calls are added at its end."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

WorkloadKey = tuple[str, tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class LearnedStep:
    """A learned step: its calls by Definition and by workload (summed, so that a replayed step adds
    them in one go), the NVTX label of each hooked invocation, and its lost invocations per op."""

    calls: Counter[str]
    workloads: Counter[WorkloadKey]
    labels: tuple[str, ...]
    lost: tuple[tuple[str, int], ...]


@dataclass
class StepLearning:
    """A step being learned: each recorded call's workload key and each invocation's label, in order."""

    keys: list[WorkloadKey] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    lost: Counter[str] = field(default_factory=Counter)

    @property
    def empty(self) -> bool:
        return not self.labels

    def learned(self) -> LearnedStep:
        workloads = Counter(self.keys)
        calls: Counter[str] = Counter()
        for (name, _), n in workloads.items():
            calls[name] += n
        return LearnedStep(calls, workloads, tuple(self.labels), tuple(self.lost.items()))


class StepReplay:
    """A step like a learned one: its hooked invocations are counted (the hot path: a few operations
    each), and each gets the label its place had in the learned step."""

    __slots__ = ("step", "replayed")

    def __init__(self, step: LearnedStep) -> None:
        self.step = step
        self.replayed = 0

    def count(self, op: str, times: int = 1) -> str:
        """``times`` invocations of ``op``; returns the label of the first."""
        index = self.replayed
        self.replayed = index + times
        labels = self.step.labels
        return labels[index] if index < len(labels) else op

    def count_at(self, times: int, offsets: tuple[int, ...]) -> list[str]:
        """``times`` invocations at once; returns the labels of those at ``offsets`` among them."""
        index = self.replayed
        self.replayed = index + times
        labels = self.step.labels
        return [labels[index + offset] if index + offset < len(labels) else "" for offset in offsets]

    @property
    def matches(self) -> bool:
        """As many hooked invocations as the learned step had."""
        return self.replayed == len(self.step.labels)
