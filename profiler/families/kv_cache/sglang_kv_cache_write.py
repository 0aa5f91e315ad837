from sglang.jit_kernel.kvcache import can_use_store_cache, store_cache


def run(key, value, k_cache, v_cache, slot_mapping):
    """SGLang's ``set_kv_buffer`` on its token-granular cache: its JIT ``store_cache`` kernel, rows of
    ``num_kv_heads * head_dim`` written at the slots, as ``MHATokenToKVPool`` calls it."""
    row = key.shape[1] * key.shape[2]
    row_bytes = row * key.element_size()
    if not can_use_store_cache(row_bytes):
        raise RuntimeError(f"SGLang's store_cache kernel does not take rows of {row_bytes} bytes here")
    store_cache(key.view(-1, row), value.view(-1, row), k_cache.view(-1, row), v_cache.view(-1, row), slot_mapping,
                row_bytes=row_bytes, size_limit=k_cache.shape[0] * k_cache.shape[1])
