"""One step's paged-KV layout in flashinfer's terms (indptr arrays, page ids, last-page lengths),
split into its decode and prefill requests, and the step's shape: what fixes its calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class PagedBatch:
    """One step's paged-KV layout in flashinfer's terms, for the requests of one kind. The page
    ids are gathered from the block table only when asked for (:meth:`gather_kv_indices`): the
    recorder keeps them for a workload it has not seen, and every other step needs only the
    counts, which come from the host."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    _block_table: Optional[torch.Tensor] = None
    _rows: Optional[np.ndarray] = None
    _pages: Optional[np.ndarray] = None
    _kv_indices: Optional[torch.Tensor] = None

    def gather_kv_indices(self) -> torch.Tensor:
        if self._kv_indices is None:
            assert self._block_table is not None and self._rows is not None and self._pages is not None
            self._kv_indices = _gather_pages(self._block_table, self._rows, self._pages, self.kv_indptr.numpy())
        return self._kv_indices

    @property
    def kv_indices(self) -> torch.Tensor:
        return self.gather_kv_indices()

    @property
    def batch_size(self) -> int:
        return len(self.kv_indptr) - 1

    @property
    def total_q(self) -> int:
        return int(self.qo_indptr[-1])


def step_shape(query_start_loc: torch.Tensor, num_reqs: int) -> tuple:
    """What fixes a step's calls but attention's: tokens, requests, and per part (decode, prefill)
    the request count and query tokens. The KV pages are left out: they change every few decode
    steps (every step with page size 1) while nothing else does, so attention is recorded live in
    every step instead (``HookPoint.live``). From CPU tensors (via numpy: this runs every step, and
    numpy is several times cheaper than torch on a few dozen numbers) it needs no device sync."""
    n = num_reqs
    qsl = query_start_loc.numpy()
    q_lens = qsl[1 : n + 1] - qsl[:n]
    decodes, prefills = int((q_lens == 1).sum()), int((q_lens > 1).sum())  # no query token: CUDA-graph padding
    return (int(qsl[n]) - int(qsl[0]), decodes + prefills, decodes, prefills)


def paged_batches(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, page_size: int,
    decode_max_query: int = 1,
) -> tuple[Optional[PagedBatch], Optional[PagedBatch]]:
    """Split a step into its decode requests (one query token; up to ``decode_max_query`` where the
    backend runs short queries as decodes) and its prefill requests (more); a request with no
    query token is padding (a CUDA graph's batch), with no attention work.

    ``query_start_loc`` and ``seq_lens`` should be the runner's CPU copies: everything but the page
    ids is computed from them (numpy: this runs every step). The page ids are gathered where the
    block table lives and stay there (see :func:`_gather_pages`)."""
    qsl = query_start_loc.detach().to("cpu", torch.int64).numpy()
    lens = seq_lens.detach().to("cpu", torch.int64).numpy()
    n = len(lens)
    q_lens = qsl[1 : n + 1] - qsl[:n]
    pages = (lens + page_size - 1) // page_size
    parts = []
    for chosen in ((q_lens >= 1) & (q_lens <= decode_max_query), q_lens > decode_max_query):
        idx = chosen.nonzero()[0]
        if idx.size == 0:
            parts.append(None)
            continue
        sel_pages = pages[idx]
        kv_indptr = np.concatenate([[0], sel_pages.cumsum()])
        parts.append(
            PagedBatch(
                qo_indptr=torch.from_numpy(np.concatenate([[0], q_lens[idx].cumsum()]).astype(np.int32)),
                kv_indptr=torch.from_numpy(kv_indptr.astype(np.int32)),
                kv_last_page_len=torch.from_numpy((lens[idx] - (sel_pages - 1) * page_size).astype(np.int32)),
                _block_table=block_table, _rows=idx, _pages=sel_pages,
            )
        )
    return parts[0], parts[1]


def _gather_pages(block_table: torch.Tensor, rows: np.ndarray, pages: np.ndarray, indptr: np.ndarray) -> torch.Tensor:
    """``block_table[r, :pages[r]]`` for each chosen row, concatenated (``indptr`` their offsets),
    as int32, where the table is.

    On a GPU only the rows, page counts and start offsets go up (a few numbers per request, through
    a cached pinned block: a copy from pageable memory would wait for the device to drain its
    stream); the per-page coordinates are expanded there, with the total known on the host so that
    nothing synchronizes."""
    total = int(indptr[-1])
    if block_table.device.type != "cuda":
        cols = np.arange(total) - np.repeat(indptr[:-1], pages)
        return block_table[torch.from_numpy(np.repeat(rows, pages)), torch.from_numpy(cols)].to(torch.int32)
    small = torch.from_numpy(np.stack([rows, pages, indptr[:-1]]).astype(np.int64))
    pinned = torch.empty(small.shape, dtype=torch.int64, pin_memory=True).copy_(small)
    rows_d, pages_d, starts_d = pinned.to(block_table.device, non_blocking=True)
    row_of_page = torch.repeat_interleave(rows_d, pages_d, output_size=total)
    cols = torch.arange(total, device=block_table.device) - torch.repeat_interleave(starts_d, pages_d, output_size=total)
    return block_table[row_of_page, cols].to(torch.int32)
