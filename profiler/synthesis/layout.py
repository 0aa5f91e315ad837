"""Index tensors of a batch of sequences that satisfy a Definition's structure.

``qo_indptr``, ``kv_indptr``, ``kv_indices`` and ``kv_last_page_len`` are built together so that
every sequence is causal-valid (at least as many KV tokens as query tokens), indptrs are monotone
from 0 to the total their constraint names, page ids are unique and below ``num_pages``, and
last-page lengths lie in ``[1, page_size]``. Tensors the caller already has (captured ones) are
kept and the rest are made to agree with them.
"""

from __future__ import annotations

import ast
import warnings
from typing import Mapping, Optional, Sequence

import torch

from fi_profile.schema.definition import Definition

INDPTR_SUFFIXES = ("indptr", "cu_seqlens")


class SynthesisError(ValueError):
    """No valid inputs exist for these axis values."""


def indptr_totals(definition: Definition) -> dict[str, str]:
    """Map each index-pointer tensor to the axis its last element must equal.

    Read from constraints shaped like ``total_q == qo_indptr[-1].item()``.
    """
    totals: dict[str, str] = {}
    for constraint in definition.parsed_constraints:
        node = constraint.tree.body
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
            continue
        for axis_side, tensor_side in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
            tensor = _last_item_of(tensor_side)
            if isinstance(axis_side, ast.Name) and tensor is not None:
                totals[tensor] = axis_side.id
    return totals


def _last_item_of(node: ast.AST) -> Optional[str]:
    """``name`` for the expression ``name[-1].item()``, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item"):
        return None
    sub = node.func.value
    if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name):
        index = sub.slice
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and getattr(index.operand, "value", None) == 1:
            return sub.value.id
    return None


def split_total(total: int, minimums: Sequence[int], gen: torch.Generator) -> list[int]:
    """A random composition of ``total`` into ``len(minimums)`` parts, each at least its minimum.

    When the minimums cannot all be met, falls back to parts of at least 1 (or 0) with a warning.
    """
    n = len(minimums)
    if n == 0:
        return []
    if sum(minimums) > total:
        floor = 1 if total >= n else 0
        warnings.warn(
            f"cannot give {n} sequences at least {list(minimums)} of {total}; using at least {floor} each",
            stacklevel=3,
        )
        minimums = [floor] * n
    extra = total - sum(minimums)
    cuts = sorted(torch.randint(0, extra + 1, (n - 1,), generator=gen).tolist())
    parts = [b - a for a, b in zip([0] + cuts, cuts + [extra])]
    return [m + p for m, p in zip(minimums, parts)]


def _cumsum(parts: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(len(parts) + 1, dtype=torch.int64)
    out[1:] = torch.tensor(list(parts), dtype=torch.int64).cumsum(0)
    return out


def _lengths(indptr: torch.Tensor) -> list[int]:
    return indptr.diff().tolist()


def build_layout(
    definition: Definition,
    axes: Mapping[str, int],
    given: Mapping[str, torch.Tensor],
    gen: torch.Generator,
) -> dict[str, torch.Tensor]:
    """Index tensors for every structural input of ``definition`` not in ``given`` (int64, CPU)."""
    names = set(definition.inputs)
    totals = indptr_totals(definition)
    out: dict[str, torch.Tensor] = {}

    def length_of(name: str) -> int:
        shape = definition.inputs[name].shape or []
        return axes[shape[0]] if shape else 0

    def total_of(name: str, fallback: int) -> int:
        return axes[totals[name]] if name in totals else fallback

    indptrs = [n for n in definition.inputs if n.endswith(INDPTR_SUFFIXES)]
    if not indptrs:
        return out
    batch = length_of(indptrs[0]) - 1
    if batch < 0:
        raise SynthesisError(f"{indptrs[0]} must have at least one element")

    q_lens: Optional[list[int]] = None
    if "qo_indptr" in names:
        qo = given.get("qo_indptr")
        if qo is None:
            qo = _cumsum(split_total(total_of("qo_indptr", batch), [1] * batch, gen))
            out["qo_indptr"] = qo
        q_lens = _lengths(qo.cpu())

    page_size = axes.get("page_size", 1)
    if "kv_indices" in names:  # paged KV cache
        kv_indptr = given.get("kv_indptr")
        if kv_indptr is None:
            count = total_of("kv_indptr", length_of("kv_indices"))
            minimums = [max(1, -(-q // page_size)) for q in q_lens] if q_lens else [1] * batch
            kv_indptr = _cumsum(split_total(count, minimums, gen))
            out["kv_indptr"] = kv_indptr
        pages = _lengths(kv_indptr.cpu())
        if "kv_indices" not in given:
            count = sum(pages)
            num_pages = _num_pages(definition, axes)
            if num_pages < count:
                raise SynthesisError(
                    f"{count} unique page ids are needed but num_pages is {num_pages}"
                )
            out["kv_indices"] = torch.randperm(num_pages, generator=gen)[:count]
        if "kv_last_page_len" in names and "kv_last_page_len" not in given:
            lasts = []
            for b, n_pages in enumerate(pages):
                need = (q_lens[b] if q_lens else 1) - (n_pages - 1) * page_size
                low = min(max(1, need), page_size)
                lasts.append(int(torch.randint(low, page_size + 1, (1,), generator=gen)))
            # Some flashinfer-trace files declare this [len_indptr], one longer than the batch:
            # follow the declared shape; the extra entries are never read.
            lasts += [page_size] * (length_of("kv_last_page_len") - len(lasts))
            out["kv_last_page_len"] = torch.tensor(lasts, dtype=torch.int64)
    elif "kv_indptr" in names and "kv_indptr" not in given:  # ragged KV
        total = total_of("kv_indptr", batch)
        out["kv_indptr"] = _cumsum(split_total(total, q_lens or [1] * batch, gen))

    for name in indptrs:
        if name not in out and name not in given:
            n = length_of(name) - 1
            total = total_of(name, n)
            out[name] = _cumsum(split_total(total, [1] * n, gen))
    return out


def _num_pages(definition: Definition, axes: Mapping[str, int]) -> int:
    for cache in ("k_cache", "ckv_cache", "kv_cache"):
        spec = definition.inputs.get(cache)
        if spec is not None and spec.shape:
            return axes[spec.shape[0]]
    return axes.get("num_pages", 0)
