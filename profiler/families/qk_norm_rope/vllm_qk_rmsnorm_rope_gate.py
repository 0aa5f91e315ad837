"""vLLM's Triton ``fused_qk_rmsnorm_rope_gate``, as Qwen3-Next's and Qwen3.5's attention calls it,
with the weights as applied: ``norm_beta`` 0 where the kernel takes one (vLLM 0.3x adds it to the
layers' raw weights), the Definition's weights being ``1 + w`` already."""

import inspect

from vllm.model_executor.layers.fused_qk_norm_rope import fused_qk_rmsnorm_rope_gate

EPS = 1e-6
_BETA = {"norm_beta": 0.0} if "norm_beta" in inspect.signature(fused_qk_rmsnorm_rope_gate).parameters else {}


def run(q_gate, k, q_weight, k_weight, cos_sin_cache, positions):
    tokens, heads, gated = q_gate.shape
    _, kv_heads, head_size = k.shape
    q, k_out, gate = fused_qk_rmsnorm_rope_gate(
        q_gate.reshape(tokens, heads * gated), k.reshape(tokens, kv_heads * head_size), q_weight, k_weight,
        cos_sin_cache, positions, EPS, heads, kv_heads, head_size, cos_sin_cache.shape[-1], **_BETA)
    return q.view(tokens, heads, head_size), k_out.view(tokens, kv_heads, head_size), gate.view(tokens, heads, head_size)
