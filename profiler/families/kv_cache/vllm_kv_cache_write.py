import torch
import vllm._custom_ops  # registers torch.ops._C_cache_ops

_ONE = {}


def run(key, value, k_cache, v_cache, slot_mapping):
    scale = _ONE.get(key.device)
    if scale is None:
        scale = _ONE[key.device] = torch.ones((), dtype=torch.float32, device=key.device)
    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, "auto", scale, scale)
