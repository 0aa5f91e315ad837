"""Request lengths of a capture scenario: one length for every request, or a range drawn from.

Real traffic mixes prompt and output lengths, and so do the shapes the kernels see: a capture whose
requests all have one length keeps a couple of workloads per GEMM. A length is ``N`` or
``MIN:MAX`` (each request's length drawn uniformly, seeded); ``range_ratio`` turns ``N`` into
``floor(N * (1 - r)):ceil(N * (1 + r))`` as vLLM's serving benchmark does with
``--random-range-ratio``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Length:
    low: int
    high: int

    @classmethod
    def parse(cls, text: str, option: str, range_ratio: float = 0.0) -> "Length":
        """``N`` or ``MIN:MAX`` (``option`` names the flag in errors); ``range_ratio`` in [0, 1)
        widens a single ``N``."""
        parts = text.strip().split(":")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{option} {text!r}: expected N or MIN:MAX (whole numbers of tokens)") from None
        if len(values) not in (1, 2) or min(values) < 1:
            raise ValueError(f"{option} {text!r}: expected N or MIN:MAX, each at least 1")
        if len(values) == 2:
            if values[0] > values[1]:
                raise ValueError(f"{option} {text!r}: MIN is above MAX")
            if range_ratio:
                raise ValueError(f"{option} {text!r}: a range and --range-ratio together; give one")
            return cls(values[0], values[1])
        if not 0.0 <= range_ratio < 1.0:
            raise ValueError(f"--range-ratio {range_ratio}: expected a value in [0, 1)")
        n = values[0]
        return cls(max(1, math.floor(n * (1 - range_ratio))), math.ceil(n * (1 + range_ratio)))

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


def draw_lengths(seed: int, count: int, length: Length, salt: str) -> list[int]:
    """``count`` lengths in ``length``'s range, the same for the same seed (``salt`` keeps the
    prompt and output draws apart)."""
    if length.low == length.high:
        return [length.low] * count
    rng = random.Random(f"{seed}:{salt}")
    return [rng.randint(length.low, length.high) for _ in range(count)]
