import torch
from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

#: the scales as the one-element float32 tensors vLLM's layers hold (``_k_scale``), made once per value
_SCALES = {}


def _scale(value, device):
    key = (float(value), device)
    if key not in _SCALES:
        _SCALES[key] = torch.tensor(float(value), dtype=torch.float32, device=device)
    return _SCALES[key]


def run(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    """vLLM's Triton KV-cache write into FP8 (e4m3) caches, as its TRITON_ATTN backend calls it with
    ``kv_cache_dtype="fp8"`` and the layer's scales: each value divided by its scale, stored as FP8."""
    triton_reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, "fp8",
                                   _scale(k_scale, key.device), _scale(v_scale, key.device))
