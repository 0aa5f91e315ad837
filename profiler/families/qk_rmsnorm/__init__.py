"""RMSNorm of every query and key head in one kernel (SGLang's fused q/k norm, Qwen3's q/k norms
on CUDA). Op type ``qk_rmsnorm``."""

from __future__ import annotations

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix, rows
from fi_profile.families.family import Baseline, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "qk_rmsnorm"


def call(q: torch.Tensor, k: torch.Tensor, eps: float) -> KernelCall:
    """``q`` and ``k`` as ``[tokens, heads, head_dim]`` each."""
    heads, kv_heads, head_dim = int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1])

    def build() -> Definition:
        dtype = schema_dtype(q.dtype)
        return definition_for("qk_rmsnorm_h32_kv4_d128", f"qk_rmsnorm_h{heads}_kv{kv_heads}_d{head_dim}{dtype_suffix(dtype)}",
                              {"num_qo_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}, dtype, {"EPS": eps})

    definition = cached_definition(("qk_rmsnorm", heads, kv_heads, head_dim, q.dtype, eps), build)
    return KernelCall(definition, {"num_tokens": rows(q, heads * head_dim)})


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("qk_rmsnorm",),
    templates=("qk_rmsnorm_h32_kv4_d128",),
    baselines=(Baseline("torch_qk_rmsnorm.py", ("EPS",)),),
    kernel_words=("rms", "rmsnorm", "rms_norm", "rsqrt", "qknorm"),
    reduces=True,
)
