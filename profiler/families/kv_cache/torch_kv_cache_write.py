def run(key, value, k_cache, v_cache, slot_mapping):
    """In place, as the engines write: the caches viewed as rows of slots, the written rows set."""
    num_pages, page_size, num_kv_heads, head_dim = k_cache.shape
    written = slot_mapping >= 0
    slots = slot_mapping[written]
    k_cache.view(num_pages * page_size, num_kv_heads, head_dim).index_copy_(0, slots, key[written].to(k_cache.dtype))
    v_cache.view(num_pages * page_size, num_kv_heads, head_dim).index_copy_(0, slots, value[written].to(v_cache.dtype))
    return k_cache, v_cache
