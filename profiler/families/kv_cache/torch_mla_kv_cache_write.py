import torch


def run(ckv, kpe, ckv_cache, kpe_cache, slot_mapping, kv_scale=None):
    """In place, as the engines write: the caches viewed as rows of slots, the written rows set; an
    FP8 latent cache (``kv_scale`` given) stores each value divided by its one scale, saturated
    (copied as bytes: PyTorch has no FP8 ``index_copy_`` on every device)."""
    num_pages, page_size = ckv_cache.shape[:2]
    written = slot_mapping >= 0
    slots = slot_mapping[written]
    for new, cache in ((ckv, ckv_cache), (kpe, kpe_cache)):
        rows = new[written]
        if kv_scale is not None:
            rows = (rows.float() / kv_scale).clamp(-448.0, 448.0)
        rows, target = rows.to(cache.dtype), cache.view(num_pages * page_size, -1)
        if cache.dtype.itemsize == 1:
            rows, target = rows.view(torch.uint8), target.view(torch.uint8)
        target.index_copy_(0, slots, rows)
    return ckv_cache, kpe_cache
