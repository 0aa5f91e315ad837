"""vLLM's Triton chunked SSD scan (``mamba_chunk_scan_combined_varlen``), as its Mamba-2 mixer calls
it over a step's prefills: each sequence from its slot's state (where it has one) or zeros, the
final states written to the sequences' slots. The chunk metadata the engine builds once per step
is built here, each sequence cut into chunks of ``CHUNK_SIZE`` from its first token (the engine
aligns a continued sequence's chunks to its computed tokens instead: the same sums, split
otherwise)."""

import torch
from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen

#: the model's ``chunk_size`` (Nemotron-H's)
CHUNK_SIZE = 128


def _chunks(bounds: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunk starts then the total, each chunk's sequence, each sequence's last chunk."""
    starts, sequence, last = [], [], []
    for i in range(len(bounds) - 1):
        for offset in range(0, max(bounds[i + 1] - bounds[i], 1), CHUNK_SIZE):
            starts.append(bounds[i] + offset)
            sequence.append(i)
        last.append(len(sequence) - 1)
    starts.append(bounds[-1])
    return tuple(torch.tensor(v, dtype=torch.int32, device=device) for v in (starts, sequence, last))


def run(x, dt, A, B, C, D, dt_bias, cu_seqlens, state, state_indices, has_initial_state):
    cu_chunk_seqlens, seq_idx, last_chunk_indices = _chunks(cu_seqlens.tolist(), x.device)
    slots = state_indices.long()
    live = slots >= 0
    chosen = slots.clamp_min(0)
    initial = torch.where((has_initial_state & live)[:, None, None, None], state[chosen], 0)
    out = torch.empty_like(x)
    final = mamba_chunk_scan_combined_varlen(x, dt, A, B, C, chunk_size=CHUNK_SIZE, cu_seqlens=cu_seqlens,
                                             cu_chunk_seqlens=cu_chunk_seqlens, last_chunk_indices=last_chunk_indices,
                                             seq_idx=seq_idx, out=out, D=D, z=None, dt_bias=dt_bias,
                                             initial_states=initial, dt_softplus=True, dt_limit=(0.0, float("inf")),
                                             state_dtype=state.dtype)
    state[slots[live]] = final[live].to(state.dtype)
    return out
