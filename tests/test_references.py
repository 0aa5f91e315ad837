"""Each shipped reference against an independent computation (torch.nn.functional, SDPA, ...)."""

import math

import pytest
import torch
import torch.nn.functional as F

from fi_profile.catalog import shipped_definition
from fi_profile.entry_points import run_reference
from fi_profile.synthesis import synthesize_inputs

BF16 = dict(atol=1e-2, rtol=1.6e-2)


def reference(name, axes, seed=0, **given):
    definition = shipped_definition(name)
    inputs = synthesize_inputs(definition, axes, seed=seed, given=given)
    return inputs, run_reference(definition, inputs)


def test_rmsnorm():
    inputs, out = reference("rmsnorm_h4096", {"batch_size": 5})
    x, w = inputs["hidden_states"].float(), inputs["weight"].float()
    expected = F.rms_norm(x, (4096,), w, eps=1e-5).to(torch.bfloat16)
    torch.testing.assert_close(out["output"], expected, **BF16)


def test_fused_add_rmsnorm():
    inputs, out = reference("fused_add_rmsnorm_inplace_h4096", {"batch_size": 5})
    x = inputs["hidden_states"].float() + inputs["residual"].float()
    expected = F.rms_norm(x, (4096,), inputs["weight"].float(), eps=1e-5).to(torch.bfloat16)
    torch.testing.assert_close(out["output"], expected, **BF16)


def test_qk_rmsnorm_per_head():
    """SGLang's fused q/k norm: an RMSNorm over each head's 128 values, the query and key weights."""
    inputs, out = reference("qk_rmsnorm_h32_kv4_d128", {"num_tokens": 3})
    for x, w, name in (("q", "q_weight", "q_out"), ("k", "k_weight", "k_out")):
        expected = torch.stack([F.rms_norm(inputs[x][t].float(), (128,), inputs[w].float(), eps=1e-6)
                                for t in range(3)]).to(torch.bfloat16)
        torch.testing.assert_close(out[name], expected, **BF16)


def test_silu_and_mul():
    inputs, out = reference("silu_and_mul_i14336", {"num_tokens": 3})
    gate, up = inputs["input"].float().chunk(2, dim=-1)
    torch.testing.assert_close(out["output"], (F.silu(gate) * up).to(torch.bfloat16), **BF16)


def test_embedding():
    inputs, out = reference("embedding_v128256_h4096", {"num_tokens": 6})
    expected = F.embedding(inputs["input_ids"].long(), inputs["weight"])
    assert torch.equal(out["output"], expected)


@pytest.mark.parametrize("name", ["gemm_bf16_n6144_k4096", "gemm_bf16_n4096_k14336", "gemm_bf16_n128256_k4096"])
def test_gemm(name):
    inputs, out = reference(name, {"M": 3})
    expected = F.linear(inputs["A"].float(), inputs["B"].float()).to(torch.bfloat16)
    torch.testing.assert_close(out["C"], expected, **BF16)


def test_gemm_with_bias():
    inputs, out = reference("gemm_bias_bf16_n4096_k4096", {"M": 3})
    expected = F.linear(inputs["A"].float(), inputs["B"].float(), inputs["bias"].float()).to(torch.bfloat16)
    torch.testing.assert_close(out["C"], expected, **BF16)


def test_a_linear_layer_that_adds_its_bias_in_the_gemm_is_recorded_with_it():
    """Qwen2's q/k/v projections hand their bias to the linear method, which adds it in the GEMM
    (F.linear): a GEMM with bias, never recorded as the plain one; lm_head's embedding bias too."""
    from types import SimpleNamespace

    from fi_profile.families import gemm

    layer = SimpleNamespace(output_size_per_partition=512, input_size_per_partition=256)
    x = torch.zeros(5, 256, dtype=torch.bfloat16)
    (plain,), (biased,) = gemm.linear_calls(None, layer, x), gemm.linear_calls(None, layer, x, torch.zeros(512))
    assert plain.definition.name == "gemm_bf16_n512_k256" and biased.definition.name == "gemm_bias_bf16_n512_k256"
    assert list(biased.definition.inputs) == ["A", "B", "bias"] and biased.axes == {"M": 5}
    head = SimpleNamespace(num_embeddings_per_partition=2048, embedding_dim=256)
    (logits,) = gemm.lm_head_calls(SimpleNamespace(), head, x, torch.zeros(2048))
    assert logits.definition.name == "gemm_bias_bf16_n2048_k256"


def llama3_inv_freq_hf_style(dim=128, theta=500000.0, factor=8.0, low=1.0, high=4.0, original=8192):
    """Vectorised, as transformers' _compute_llama3_parameters writes it."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, smoothed, scaled)


def test_rope_llama3():
    positions = torch.tensor([0, 1, 7, 100, 4095, 8191, 20000, 131071])
    inputs, out = reference("rope_llama3_neox_style_h32_kv8_d128", {"num_tokens": 8}, positions=positions)
    angle = positions.double()[:, None] * llama3_inv_freq_hf_style()[None, :]
    rotation = torch.polar(torch.ones_like(angle), angle)[:, None, :]  # e^{i theta}, per pair

    def rotate(x):  # NeoX pairs (i, i + 64) as complex numbers
        x = x.double()
        z = torch.complex(x[..., :64], x[..., 64:]) * rotation
        return torch.cat([z.real, z.imag], dim=-1).to(torch.bfloat16)

    torch.testing.assert_close(out["q_out"], rotate(inputs["q"]), **BF16)
    torch.testing.assert_close(out["k_out"], rotate(inputs["k"]), **BF16)
    # Llama-3 scaling really changes the result against plain RoPE at long positions.
    plain = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    assert not torch.allclose(plain, llama3_inv_freq_hf_style())


def sdpa_with_lse(q, k, v, sm_scale):
    """q [Tq, H, D], k/v [Tk, Hkv, D]; causal aligned bottom-right, like the engines."""
    tq, tk = q.shape[0], k.shape[0]
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
    qh, kh, vh = (t.double().transpose(0, 1) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=sm_scale, enable_gqa=True)
    kh = kh.repeat_interleave(q.shape[1] // k.shape[1], dim=0)
    scores = (qh @ kh.transpose(-1, -2)) * sm_scale
    lse2 = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1) / math.log(2)
    return out.transpose(0, 1), lse2.transpose(0, 1)


def gather_paged(cache, indices, last_len, page_size):
    tokens = cache[indices.long()].reshape(-1, *cache.shape[2:])
    return tokens[: (len(indices) - 1) * page_size + last_len]


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_decode(page_size):
    name = f"gqa_paged_decode_h32_kv8_d128_ps{page_size}"
    inputs, out = reference(name, {"batch_size": 3, "len_indptr": 4, "num_kv_indices": 9, "num_pages": 20})
    indptr = inputs["kv_indptr"]
    for b in range(3):
        pages = inputs["kv_indices"][indptr[b] : indptr[b + 1]]
        last = int(inputs["kv_last_page_len"][b]) if page_size > 1 else 1
        k = gather_paged(inputs["k_cache"], pages, last, page_size)
        v = gather_paged(inputs["v_cache"], pages, last, page_size)
        expected, lse = sdpa_with_lse(inputs["q"][b : b + 1], k, v, inputs["sm_scale"])
        torch.testing.assert_close(out["output"][b : b + 1], expected.to(torch.bfloat16), **BF16)
        torch.testing.assert_close(out["lse"][b : b + 1], lse.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_prefill(page_size):
    name = f"gqa_paged_prefill_causal_h32_kv8_d128_ps{page_size}"
    axes = {"len_indptr": 3, "total_q": 10, "num_kv_indices": 12, "num_pages": 30}
    if page_size > 1:
        axes["batch_size"] = 2
    inputs, out = reference(name, axes)
    qo, kv = inputs["qo_indptr"], inputs["kv_indptr"]
    for b in range(2):
        pages = inputs["kv_indices"][kv[b] : kv[b + 1]]
        last = int(inputs["kv_last_page_len"][b]) if page_size > 1 else 1
        k = gather_paged(inputs["k_cache"], pages, last, page_size)
        v = gather_paged(inputs["v_cache"], pages, last, page_size)
        rows = slice(int(qo[b]), int(qo[b + 1]))
        expected, lse = sdpa_with_lse(inputs["q"][rows], k, v, inputs["sm_scale"])
        torch.testing.assert_close(out["output"][rows], expected.to(torch.bfloat16), **BF16)
        torch.testing.assert_close(out["lse"][rows], lse.float(), atol=1e-3, rtol=1e-3)


def test_ragged_prefill():
    inputs, out = reference("gqa_ragged_prefill_causal_h32_kv8_d128", {"len_indptr": 3, "total_q": 9, "total_kv": 20})
    qo, kv = inputs["qo_indptr"], inputs["kv_indptr"]
    for b in range(2):
        rows, cols = slice(int(qo[b]), int(qo[b + 1])), slice(int(kv[b]), int(kv[b + 1]))
        expected, lse = sdpa_with_lse(inputs["q"][rows], inputs["k"][cols], inputs["v"][cols], inputs["sm_scale"])
        torch.testing.assert_close(out["output"][rows], expected.to(torch.bfloat16), **BF16)
        torch.testing.assert_close(out["lse"][rows], lse.float(), atol=1e-3, rtol=1e-3)


def peaked_probs(batch):
    """Mass on tokens 10, 20, 30, 40 (0.5, 0.3, 0.15, 0.05 minus a sliver on the rest)."""
    probs = torch.full((128256,), 1e-9)
    probs[[10, 20, 30, 40]] = torch.tensor([0.5, 0.3, 0.15, 0.05])
    probs = probs / probs.sum()
    return probs.expand(batch, -1).contiguous()


@pytest.mark.parametrize(
    "name, top_k, top_p, expected",
    [
        # top-k 2 keeps {10, 20}, renormalised 0.5/0.8 and 0.3/0.8
        ("top_k_sampling_from_probs_v128256", 2, None, {10: 0.625, 20: 0.375}),
        # nucleus 0.7: the smallest prefix whose mass reaches 0.7 is {10, 20}
        ("top_p_sampling_from_probs_v128256", None, 0.7, {10: 0.625, 20: 0.375}),
        # top-k 3 gives {10: .526, 20: .316, 30: .158}; then top-p 0.9 keeps all three
        ("top_k_top_p_sampling_from_probs_v128256", 3, 0.9, {10: 0.5 / 0.95, 20: 0.3 / 0.95, 30: 0.15 / 0.95}),
    ],
)
def test_sampling_distribution(name, top_k, top_p, expected):
    batch = 400
    given = {"probs": peaked_probs(batch)}
    if top_k is not None:
        given["top_k"] = torch.full((batch,), top_k, dtype=torch.int32)
    if top_p is not None:
        given["top_p"] = torch.full((batch,), top_p, dtype=torch.float32)
    torch.manual_seed(0)
    _, out = reference(name, {"batch_size": batch}, **given)
    samples = out["samples"].tolist()
    assert set(samples) <= set(expected), "only tokens inside the filtered set are drawn"
    for token, p in expected.items():
        freq = samples.count(token) / batch
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / batch), (token, freq, p)


@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_reference_against_dense_mixture(renormalize):
    """The MoE template, instantiated small as capture does, against every expert run on every token."""
    from fi_profile.families import moe

    E, K, H, I, T = 6, 2, 32, 16, 9
    probe = torch.zeros(T, H, dtype=torch.bfloat16)
    definition = moe.call(probe, torch.zeros(T, E, dtype=torch.bfloat16), E, K, I, renormalize).definition
    assert definition.name == f"moe_bf16_{'renorm' if renormalize else 'softmax'}_topk{K}_e{E}_h{H}_i{I}"
    inputs = synthesize_inputs(definition, {"seq_len": T}, seed=3)
    out = run_reference(definition, inputs)["output"]

    x, logits = inputs["hidden_states"].float(), inputs["routing_logits"].float()
    w13, w2 = inputs["gemm1_weights"].float(), inputs["gemm2_weights"].float()
    probs = logits.softmax(-1)
    kth = probs.topk(K, dim=-1).values[:, -1:]
    gates = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    expert_out = torch.stack(
        [(F.silu(x @ w13[e, :I].T) * (x @ w13[e, I:].T)) @ w2[e].T for e in range(E)], dim=1
    )  # [T, E, H]
    expected = (gates.unsqueeze(-1) * expert_out).sum(1).to(torch.bfloat16)
    torch.testing.assert_close(out, expected, **BF16)


def test_generated_silu_and_mul_keeps_its_constraint_and_computes_swiglu():
    """A template check like ``assert gate_up_size == 2 * intermediate_size`` survives instantiation."""
    from fi_profile.families import silu_and_mul

    definition = silu_and_mul.call(torch.zeros(3, 1024, dtype=torch.bfloat16)).definition
    assert definition.name == "silu_and_mul_i512" and "== 2 * intermediate_size" in definition.reference
    inputs = synthesize_inputs(definition, {"num_tokens": 3})
    gate, up = inputs["input"].float().chunk(2, dim=-1)
    torch.testing.assert_close(run_reference(definition, inputs)["output"], (F.silu(gate) * up).to(torch.bfloat16), **BF16)


@pytest.mark.parametrize("fused", [False, True])
def test_gemma_rmsnorm_scales_by_one_plus_its_weight_as_vllms_gemma_norm(fused):
    """Gemma's norm: ``x / rms(x) * (1 + w)`` in float32, then rounded (vLLM's ``GemmaRMSNorm``
    and SGLang's compute it so; FlashInfer's ``gemma_rmsnorm``)."""
    name = "gemma_fused_add_rmsnorm_inplace_h5376" if fused else "gemma_rmsnorm_h5376"
    inputs, out = reference(name, {"batch_size": 5})
    x = inputs["hidden_states"].float() + (inputs["residual"].float() if fused else 0)
    expected = F.rms_norm(x, (5376,), inputs["weight"].float() + 1.0, eps=1e-6).to(torch.bfloat16)
    torch.testing.assert_close(out["output"], expected, **BF16)
    assert not torch.allclose(out["output"].float(), F.rms_norm(x, (5376,), inputs["weight"].float(), eps=1e-6), atol=0.1)
    if fused:
        torch.testing.assert_close(out["residual_out"], x.to(torch.bfloat16))


@pytest.mark.parametrize("name, approximate", [("gelu_tanh_and_mul_i21504", "tanh"), ("gelu_and_mul_i21504", "none")])
def test_gelu_and_mul(name, approximate):
    inputs, out = reference(name, {"num_tokens": 4})
    gate, up = inputs["input"].float().chunk(2, dim=-1)
    expected = (F.gelu(gate, approximate=approximate) * up).to(torch.bfloat16)
    torch.testing.assert_close(out["output"], expected, **BF16)


def test_linear_rope_divides_each_position_by_its_factor():
    """Gemma-3's global layers: a position p rotates as p / 8 would without scaling (HF's and the
    engines' ``rope_type: linear``)."""
    inputs, out = reference("rope_linear_neox_style_h32_kv16_d128", {"num_tokens": 6})
    plain = inputs["positions"].double() / 8.0
    inv = 1.0 / 1e6 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    angles = (plain[:, None] * inv[None, :]).float()
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = inputs["q"].float().chunk(2, dim=-1)
    expected = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(torch.bfloat16)
    torch.testing.assert_close(out["q_out"], expected, **BF16)
