"""Gated DeltaNet (Qwen3-Next's linear attention), op type ``gdn``: flashinfer-trace's
``gdn_decode_*`` and ``gdn_prefill_*`` Definitions (``qk{H}_v{HV}_d{D}_k_last``), their PyTorch
baselines, and the inputs their recurrence needs to stay what a model feeds it.

No engine's layer is read into these calls yet: vLLM's ``QwenGatedDeltaNetAttention`` is listed
by name in a capture (issue 45). The dataset's references take query and key as the recurrence
uses them, unit vectors: the engines normalize them in their kernels (``use_qk_l2norm_in_kernel``)
before the delta rule, and a key of norm √128 makes the rule's ``I - beta k k^T`` grow the state by
about 128 at every token.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from fi_profile.families.family import Baseline, Family
from fi_profile.schema.definition import Definition

KEY = "gdn"

#: the decay rate A = exp(A_log) and the step dt = softplus(dt_bias) a Gated DeltaNet or Mamba-2 layer
#: is initialized with (Qwen3-Next's, after Mamba-2's): A ~ U(1, 16), dt log-uniform in [1e-3, 1e-1]
A_RANGE = (1.0, 16.0)
DT_RANGE = (1e-3, 1e-1)


def input_values(name: str, shape: tuple[int, ...], definition: Definition, gen: torch.Generator,
                 device: torch.device, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The inputs whose range the recurrence depends on; None for the rest (normal values: the
    projections ``a``, ``b`` and ``v``, and a state of unit-scale entries, which maps a unit key to a
    vector of the size of a value)."""
    if name in ("q", "k"):  # unit vectors per head, as the engines' kernels make them
        x = torch.randn(shape, generator=gen, device=device)
        return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(dtype)
    if name == "A_log":
        low, high = A_RANGE
        return torch.log(low + (high - low) * torch.rand(shape, generator=gen, device=device)).to(dtype)
    if name == "dt_bias":  # softplus^-1(dt)
        low, high = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
        dt = torch.exp(low + (high - low) * torch.rand(shape, generator=gen, device=device))
        return (dt + torch.log(-torch.expm1(-dt))).to(dtype)
    return None


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("gdn",),
    baselines=(Baseline("torch_gdn_decode.py"),
               # a Python loop over the positions, as many as the longest sequence: not compiled
               Baseline("torch_gdn_prefill.py", compiled=False)),
    # FLA's Triton kernels (vLLM's and SGLang's vendored copies) and FlashInfer's: never a GEMM's
    kernel_words=("gated_delta", "delta_rule", "gdn", "solve_tril", "kkt", "recompute_w_u", "chunk_local_cumsum"),
    input_values=input_values,
)
