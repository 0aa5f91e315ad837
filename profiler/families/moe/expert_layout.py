"""How the engines' fused experts hold what flashinfer-trace's MoE Definitions pass: gemm1's
[up; gate] halves as [gate; up], and a rank's share of the experts as a map from global expert
ids to its own. Each is built once per tensor (or shape), never in a timed call."""

import torch

_LAID_OUT = {}
_EXPERT_MAPS = {}


def gate_up(weights, scales):
    """[up; gate] weights and their block scales as [gate; up] (one layer's at a time: DeepSeek-V3's
    are 7.5 GB)."""
    key = (weights.data_ptr(), scales.data_ptr(), tuple(weights.shape))
    if key not in _LAID_OUT:
        _LAID_OUT.clear()
        _LAID_OUT[key] = tuple(torch.cat(t.chunk(2, dim=1)[::-1], dim=1).contiguous() for t in (weights, scales))
    return _LAID_OUT[key]


def expert_map(experts, first, local, device):
    """Global expert -> local index (-1 elsewhere): the rank's ``local`` experts from ``first`` on,
    as vLLM's layer and SGLang's dispatcher hold it."""
    key = (experts, int(first), local, str(device))
    if key not in _EXPERT_MAPS:
        mapped = torch.full((experts,), -1, dtype=torch.int32, device=device)
        mapped[int(first):int(first) + local] = torch.arange(local, dtype=torch.int32, device=device)
        _EXPERT_MAPS[key] = mapped
    return _EXPERT_MAPS[key]
