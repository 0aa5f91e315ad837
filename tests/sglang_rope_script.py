"""Run by test_rope_yarn.py in SGLang's venv: SGLang's DeepseekScalingRotaryEmbedding (with its own
extrapolation and attention factors) against the Definition made from its constants."""

import json

import torch
from sglang.srt.layers.rotary_embedding.rope_variant import DeepseekScalingRotaryEmbedding

from fi_profile.entry_points import run_reference
from fi_profile.families.rope import _yarn_params, call, layer_problem

found = []
for extrapolation, attn in ((1.0, 1.0), (0.5, 1.3)):
    layer = DeepseekScalingRotaryEmbedding(64, 64, 4096, 10000, False, 4.0, torch.bfloat16, extrapolation_factor=extrapolation,
                                           attn_factor=attn, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.8,
                                           device="cpu")
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(21, 8, 64, generator=generator).to(torch.bfloat16)
    k = torch.randn(21, 1, 64, generator=generator).to(torch.bfloat16)
    positions = torch.randint(0, 16384, (21,), generator=generator)
    definition = call(q, 8, 1, 64, _yarn_params(layer)).definition
    expected_q, expected_k = layer.forward_native(positions, q.clone(), k.clone())
    ours = run_reference(definition, {"q": q, "k": k, "positions": positions})
    found.append({"name": definition.name, "problem": layer_problem(layer),
                  "q": (ours["q_out"].float() - expected_q.float()).abs().max().item(),
                  "k": (ours["k_out"].float() - expected_k.float()).abs().max().item()})
print("RESULT " + json.dumps(found))
