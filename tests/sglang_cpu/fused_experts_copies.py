"""Run in the SGLang venv: two MoE natives built as the replay builds them (an FP8 one, then a bf16 one),
each importing its own copy of ``sglang_fused_experts``: SGLang's quantization hook, patched by the
last copy, still serves the FP8 input the first copy's native hands it."""

import torch

from fi_profile.catalog import shipped_definition
from fi_profile.replay.baseline_solutions import native_candidates, native_solution
from fi_profile.replay.build import build

copies = []
for name, helper in (("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e256_h7168_i2048", "fp8_experts"),
                     ("moe_bf16_renorm_topk2_e8_h4096_i14336", "experts")):
    definition = shipped_definition(name)
    (family, native), = [(f, n) for f, n in native_candidates(definition) if n.library == "sglang"]
    entry = build(native_solution(definition, family, native)).fn
    copies.append(entry.__globals__[helper].__globals__)
first, second = copies
assert first is not second, "one copy: the replay's build shares the helper between solutions"
from sglang.kernels.ops.moe import fused_moe_triton_kernels as kernels  # noqa: E402

hook = kernels.sglang_per_token_group_quant_fp8
assert hook.__globals__ is second  # the last copy imported patched SGLang's module
x = torch.zeros(2, 256, dtype=torch.bfloat16)
given = (torch.zeros(2, 256, dtype=torch.float8_e4m3fn), torch.ones(2, 2))
first["_GIVEN"][(x.data_ptr(), tuple(x.shape))] = given  # the first copy's native hands its input
assert hook(x, 128) is given
first["_GIVEN"].clear()
assert kernels._fi_profile_quantize_input.__name__ != "_given_or_quantized"  # SGLang's own, not a copy's hook
print("ok", len(copies))
