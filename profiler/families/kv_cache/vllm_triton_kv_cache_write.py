import torch
from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

_ONE = {}


def run(key, value, k_cache, v_cache, slot_mapping):
    scale = _ONE.get(key.device)
    if scale is None:
        scale = _ONE[key.device] = torch.ones((), dtype=torch.float32, device=key.device)
    triton_reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, "auto", scale, scale)
