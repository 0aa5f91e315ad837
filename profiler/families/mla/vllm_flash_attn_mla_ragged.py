import torch
from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
from vllm.vllm_flash_attn import flash_attn_varlen_func

#: layout -> (longest query and key, the index tensors, kept alive so that their addresses cannot be
#: taken by other tensors while the layout is cached)
_LAYOUTS = {}


def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    """vLLM's MLA prefill of new tokens as its default backend on Hopper runs it: FlashAttention
    (``vllm_flash_attn``, version 3 on SM90) over ragged q / k / v with the value width of its own,
    causal. vLLM keeps the LSE for merging context chunks in its own layout (natural log, heads
    first): only ``output`` is computed."""
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    key = (qo_indptr.data_ptr(), kv_indptr.data_ptr(), qo_indptr.numel(), tuple(q.shape), tuple(v.shape))
    if key not in _LAYOUTS:
        version = get_flash_attn_version(head_size=q.shape[2], head_size_v=v.shape[2])
        if version is None:
            raise RuntimeError("vllm_flash_attn has no FlashAttention version for these head sizes on this card")
        cu_q, cu_k = qo_indptr.to(torch.int32), kv_indptr.to(torch.int32)
        lengths = (int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max()))
        _LAYOUTS[key] = (dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=lengths[0], max_seqlen_k=lengths[1],
                              fa_version=version), (qo_indptr, kv_indptr))
    return flash_attn_varlen_func(q=q, k=k, v=v, softmax_scale=float(sm_scale), causal=True, **_LAYOUTS[key][0])
