"""Run in the SGLang venv: SGLang's Gemma3RMSNorm native (its forward_native) against the Definition's reference."""

import torch

from fi_profile.catalog import shipped_definition
from fi_profile.replay.baseline_solutions import native_candidates, native_solution

definition = shipped_definition("gemma_rmsnorm_h5376")
((family, native),) = native_candidates(definition)
solution = native_solution(definition, family, native)
ours, reference = {}, {}
exec(solution.sources[0].content, ours)
exec(definition.reference, reference)
gen = torch.Generator().manual_seed(0)
for rows in (1, 7, 33):
    x = torch.randn(rows, 5376, generator=gen).to(torch.bfloat16)
    w = (0.1 * torch.randn(5376, generator=gen)).to(torch.bfloat16)
    got, want = ours["run"](x, w), reference["run"](x, w)
    want = want[0] if isinstance(want, tuple) else want
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= 0.02 * want.float().abs().max().item(), diff
    assert ours["run"](x, w) is not got  # a fresh output each call
print("ok", ours["EPS"], len(ours["_layers"]))
