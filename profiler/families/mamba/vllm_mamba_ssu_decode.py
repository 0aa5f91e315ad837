"""vLLM's Triton ``selective_state_update``, as its Mamba-2 mixer calls it over one-token requests
(softplus of ``dt + dt_bias``, the requests' slots read and written): in place, the requests'
slots of ``state`` updated. Slot 0 is a slot as any other (the engine's kernel skips its null
block, 0, by default; a Definition skips -1 alone)."""

import torch
from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update


def run(state, x, dt, A, B, C, D, dt_bias, state_batch_indices):
    out = torch.empty_like(x)
    selective_state_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus=True, state_batch_indices=state_batch_indices,
                           dst_state_batch_indices=state_batch_indices, null_block_id=-1, out=out)
    return out
