"""Batched GEMM ``C[b] = A[b] @ B[b]``: one small GEMM per attention head, as MLA's absorbed decode
runs them (W_UK into the query before the attention, W_UV on its latent output after). Op type
``bmm``; its calls are made by the hooks of the layers that run them (``hooks/<engine>/mla.py``)."""

from __future__ import annotations

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import SHORT_DTYPES, KernelCall, cached_definition
from fi_profile.families import gemm
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, matmul_flops
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType

KEY = "bmm"


def name(batch: int, n: int, k: int, dtype: DType) -> str:
    return f"bmm_{SHORT_DTYPES.get(dtype, dtype.value)}_b{batch}_n{n}_k{k}"


def call(batch: int, m: int, n: int, k: int, dtype: DType) -> KernelCall:
    """``batch`` products of ``[m, k] @ [k, n]``; the sizes are the layer's logical ones (never read
    from a weight a backend may have packed)."""

    def build() -> Definition:
        return definition_for("bmm_bf16_b128_n512_k128", name(batch, n, k, dtype), {"batch": batch, "N": n, "K": k}, dtype)

    definition = cached_definition(("bmm", batch, n, k, dtype), build)
    return KernelCall(definition, {"M": m})


def _engine_kernel(run: EngineRun, definition: Definition) -> EngineKernel:
    return EngineKernel("torch", "torch.bmm (cuBLAS), as the engines' MLA layers call it")


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("bmm",),
    templates=("bmm_bf16_b128_n512_k128",),
    baselines=(Baseline("torch_bmm.py"),),
    engine_kernel=_engine_kernel,
    flops=matmul_flops,
    # cuBLAS names a batched GEMM's kernels as it names a GEMM's: the same words, so that the kernel
    # accounting takes the two families' kernels as one family's (a GEMM's split-K reduction stays
    # with its GEMM whichever of the two it is)
    kernel_words=gemm.FAMILY.kernel_words,
    head_words=gemm.FAMILY.head_words,
    continue_words=gemm.FAMILY.continue_words,
)
