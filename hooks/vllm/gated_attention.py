"""vLLM's gated attention layers (``Qwen3NextAttention``: Qwen3-Next, Qwen3.5): on CUDA the layer
runs its q/k norms, its RoPE and the split of the gate from the queries as one Triton kernel
(``fused_qk_rmsnorm_rope_gate``), past the norm and RoPE layers' own hooks. That path is recorded
as one ``qk_norm_rope`` call; elsewhere (``use_fused_qk_norm_rope_gate`` off) the layers' own hooks
record their calls and this one records nothing.

Its output gate (``attn_output * sigmoid(gate)`` in its ``forward``) is one ``sigmoid_gate_mul`` call:
watched while the layer runs eagerly (its sigmoid's and product's kernels the call's); in a compiled
forward, a template of ``forward``'s, placed between its attention and its output projection, where
Inductor's kernel of it runs."""

from __future__ import annotations

from typing import Any

import torch

from fi_profile.capture.layers import require, seen
from fi_profile.families import qk_norm_rope, sigmoid_gate_mul


def layer_calls(self: Any, qkv: torch.Tensor, positions: torch.Tensor) -> list:
    """``Qwen3NextAttention._project_qkv_gate``. The kernel takes the query norm's epsilon for both
    norms and adds 1 to their weights (GemmaRMSNorm's ``1 + w``), as the Definition does. ``positions``
    is read for its rank alone (2-D: multimodal RoPE), after the engine has used it where traced."""
    if not getattr(self, "use_fused_qk_norm_rope_gate", False):
        return []
    rope = self.rotary_emb
    seen(self.q_norm, self.k_norm, rope)
    multimodal = positions.dim() == 2 and bool(getattr(rope, "mrope_section", None))
    require(qk_norm_rope.problem(qkv.dtype, int(rope.rotary_dim), int(self.head_dim), bool(rope.is_neox_style),
                                 multimodal))
    return [qk_norm_rope.call(qkv, int(self.num_heads), int(self.num_kv_heads), int(self.head_dim),
                              int(rope.rotary_dim), float(self.q_norm.variance_epsilon), rope.cos_sin_cache)]


def traced_gate_calls(self: Any, hidden_states: torch.Tensor) -> list:
    """While torch.compile traces the layer's ``forward``: its output gate (the layer's heads on this
    rank times the head size, over the step's tokens), which the compiled forward runs past the
    eager watch (:func:`fi_profile.families.sigmoid_gate_mul.watched`)."""
    if getattr(self, "attn_output_gate", False) is not True:
        return []
    return [sigmoid_gate_mul.call(hidden_states, int(self.num_heads) * int(self.head_dim))]
