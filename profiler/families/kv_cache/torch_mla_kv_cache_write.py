def run(ckv, kpe, ckv_cache, kpe_cache, slot_mapping):
    """In place, as the engines write: the caches viewed as rows of slots, the written rows set."""
    num_pages, page_size = ckv_cache.shape[:2]
    written = slot_mapping >= 0
    slots = slot_mapping[written]
    ckv_cache.view(num_pages * page_size, -1).index_copy_(0, slots, ckv[written].to(ckv_cache.dtype))
    kpe_cache.view(num_pages * page_size, -1).index_copy_(0, slots, kpe[written].to(kpe_cache.dtype))
    return ckv_cache, kpe_cache
