import torch


def run(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """In place, as the engines write: the caches viewed as rows of slots, the written rows set; an
    FP8 cache (``k_scale``, ``v_scale`` given) stores each value divided by its scale, saturated
    (copied as bytes: PyTorch has no FP8 ``index_copy_`` on every device)."""
    num_pages, page_size, num_kv_heads, head_dim = k_cache.shape
    written = slot_mapping >= 0
    slots = slot_mapping[written]
    for new, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        rows = new[written]
        if scale is not None:
            rows = (rows.float() / scale).clamp(-448.0, 448.0)
        rows, target = rows.to(cache.dtype), cache.view(num_pages * page_size, num_kv_heads, head_dim)
        if cache.dtype.itemsize == 1:
            rows, target = rows.view(torch.uint8), target.view(torch.uint8)
        target.index_copy_(0, slots, rows)
    return k_cache, v_cache
