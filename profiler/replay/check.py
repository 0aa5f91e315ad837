"""Correctness of one output against the reference: allclose per dtype, exact for integers, or as
sets per row (a top-k's indices, in any order)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

#: output dtype -> (atol, rtol, fraction of elements that must match)
TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    torch.float32: (1e-4, 1e-4, 1.0),
    torch.float64: (1e-4, 1e-4, 1.0),
    torch.float16: (1e-2, 1e-2, 1.0),
    torch.bfloat16: (1e-2, 1.6e-2, 1.0),
    torch.float8_e4m3fn: (1e-1, 1e-1, 0.95),
    torch.float8_e5m2: (1e-1, 1e-1, 0.95),
}
#: a narrow format -> its relative precision (half its spacing at 1): the error a value rounded to it carries
PRECISION: dict[torch.dtype, float] = {torch.float8_e4m3fn: 2.0 ** -4, torch.float8_e5m2: 2.0 ** -3,
                                       torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


@dataclass
class Diff:
    max_abs: float
    max_rel: float
    mismatched: int
    total: int
    atol: float
    rtol: float
    required_match: float
    #: how it was judged, where not by the tolerances alone ("sets": rows as multisets)
    method: str = ""

    @property
    def ratio(self) -> float:
        return self.mismatched / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        return 1.0 - self.ratio >= self.required_match - 1e-12

    def merge(self, other: "Diff") -> "Diff":
        return Diff(
            max(self.max_abs, other.max_abs),
            max(self.max_rel, other.max_rel),
            self.mismatched + other.mismatched,
            self.total + other.total,
            self.atol,
            self.rtol,
            self.required_match,
            self.method or other.method,
        )


def largest_magnitude(ref: torch.Tensor) -> float:
    """The largest finite magnitude of ``ref`` (0 where it has none)."""
    finite = ref[torch.isfinite(ref)] if ref.dtype.is_floating_point else ref
    return float(finite.abs().max()) if finite.numel() else 0.0


def compare(out: torch.Tensor, ref: torch.Tensor, atol_of_largest: bool = False,
            rounded_through: Optional[torch.dtype] = None, largest_elsewhere: float = 0.0) -> Diff:
    """Element-wise |out - ref| <= atol + rtol |ref|; NaN never matches, equal infinities do.
    ``atol_of_largest``: the dtype's atol is taken relative to the reference's largest finite
    magnitude (above 1), for outputs that are sums of rounded terms larger than themselves (a MoE
    layer's experts: each one's output rounds at its own magnitude before they are added).
    ``rounded_through``: the engines' kernels round an intermediate to this narrower format that the
    reference keeps exact (an FP8 MoE's activations between its GEMMs): that atol is the format's
    relative precision instead. ``largest_elsewhere``: with ``atol_of_largest``, a magnitude of
    another output (a recurrence's state) that scales the atol where it is larger than ``ref``'s."""
    atol, rtol, required = TOLERANCES.get(ref.dtype, (0.0, 0.0, 1.0))
    if rounded_through is not None:
        atol = max(atol, PRECISION[rounded_through])
    if atol_of_largest and ref.dtype.is_floating_point:
        atol *= max(1.0, largest_magnitude(ref), largest_elsewhere)
    if not ref.dtype.is_floating_point:
        mismatch = out.to(ref.device) != ref
        diff = (out.to(ref.device).double() - ref.double()).abs()
        return Diff(float(diff.max()) if diff.numel() else 0.0, 0.0, int(mismatch.sum()), ref.numel(), 0.0, 0.0, 1.0)
    o, r = out.to(ref.device).double(), ref.double()
    same = (o == r) | (torch.isnan(o) & torch.isnan(r))  # equal infinities, NaN where the reference has NaN
    abs_diff = torch.where(same, torch.zeros_like(o), (o - r).abs())
    abs_diff = torch.nan_to_num(abs_diff, nan=float("inf"))
    rel_diff = abs_diff / r.abs().clamp_min(1e-12)
    mismatch = abs_diff > atol + rtol * r.abs().nan_to_num(posinf=0.0, neginf=0.0)
    finite = torch.isfinite(abs_diff)
    max_abs = float(abs_diff.max()) if abs_diff.numel() else 0.0
    max_rel = float(torch.where(finite, rel_diff, torch.zeros_like(rel_diff)).max()) if rel_diff.numel() else 0.0
    if not bool(finite.all()):
        max_rel = float("inf")
    return Diff(max_abs, max_rel, int(mismatch.sum()), ref.numel(), atol, rtol, required)


#: the share of a set-valued row's entries that may differ from the reference's: the entries of
#: nearly equal score at the top-k's boundary, which a kernel summing in another order may swap
SET_MISMATCH = 0.005


def compare_sets(out: torch.Tensor, ref: torch.Tensor) -> Diff:
    """Each row of ``out`` against the same row of ``ref`` as a multiset of values (a top-k's
    indices, padding included): the entries of the reference's row that ``out``'s lacks are
    mismatches, of which :data:`SET_MISMATCH` of all entries are allowed; a row of another length,
    or another shape, mismatches whole."""
    out = out.to(ref.device)
    if out.shape != ref.shape or ref.dim() == 0:
        return Diff(float("inf"), float("inf"), ref.numel(), ref.numel(), 0.0, 0.0, 1.0 - SET_MISMATCH, "sets")
    missing = 0
    for mine, expected in zip(out.reshape(-1, ref.shape[-1]), ref.reshape(-1, ref.shape[-1])):
        values, wanted = expected.unique(return_counts=True)
        held, had = mine.unique(return_counts=True)
        at = torch.searchsorted(held, values).clamp_max(max(held.numel() - 1, 0))
        present = held[at] == values
        missing += int((wanted - torch.where(present, had[at], 0)).clamp_min(0).sum())
    return Diff(0.0, 0.0, missing, ref.numel(), 0.0, 0.0, 1.0 - SET_MISMATCH, "sets")


def distribution_distance(samples: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean over rows of the total-variation distance between two sets of draws ([draws, rows])."""
    distances = []
    for row in range(samples.shape[1]):
        values = torch.cat([samples[:, row], reference[:, row]]).unique()
        ours = torch.bincount(torch.searchsorted(values, samples[:, row].contiguous()), minlength=len(values)).double()
        theirs = torch.bincount(torch.searchsorted(values, reference[:, row].contiguous()), minlength=len(values)).double()
        distances.append(0.5 * float((ours / ours.sum() - theirs / theirs.sum()).abs().sum()))
    return sum(distances) / len(distances) if distances else 0.0
