import torch
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

#: (shape, indices) -> (SGLang's arguments, the tensors they were built from, kept alive so that
#: their addresses cannot be taken by other tensors while the layout is cached)
_LAYOUTS = {}


def _layout(q, qo_indptr, kv_indptr):
    """A prefill with nothing cached, as SGLang's MHA path hands it to its Triton extend kernel: no
    prefix (an all-zero ``kv_indptr`` and no indices into an empty cache), the requests' extents."""
    key = (tuple(q.shape), qo_indptr.data_ptr(), kv_indptr.data_ptr(), qo_indptr.numel())
    if key not in _LAYOUTS:
        if len(_LAYOUTS) > 16:
            _LAYOUTS.clear()
        if not torch.equal(qo_indptr, kv_indptr):
            raise ValueError("SGLang's MHA prefill runs new tokens only: kv_indptr must equal qo_indptr")
        lens = qo_indptr[1:] - qo_indptr[:-1]
        layout = dict(qo_indptr=qo_indptr.to(torch.int64), kv_indptr=torch.zeros_like(qo_indptr, dtype=torch.int32),
                      kv_indices=torch.empty(0, dtype=torch.int64, device=q.device),
                      max_len_extend=int(lens.max()) if lens.numel() else 0)
        _LAYOUTS[key] = (layout, (qo_indptr, kv_indptr))
    return _LAYOUTS[key][0]


def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    """SGLang's ``triton`` backend on DeepSeek's up-projected prefill (``forward_normal_core``: q / k
    of qk_nope + qk_rope, v of v_head_dim, every head its own), its causal extend kernel over the
    new tokens. No log-sum-exp: only ``output`` is computed."""
    layout = _layout(q, qo_indptr, kv_indptr)
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
    extend_attention_fwd(q, k.contiguous(), v.contiguous(), out, k[:0], v[:0],
                         layout["qo_indptr"], layout["kv_indptr"], layout["kv_indices"], None, True, None,
                         layout["max_len_extend"], 1.0, 1.0, float(sm_scale), logit_cap=0.0, page_size=1)
    return out
