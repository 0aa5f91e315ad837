import torch
from vllm.model_executor.layers.quantization.utils.fp8_utils import w8a8_triton_block_scaled_mm

BLOCK_N = 128
BLOCK_K = 128


def run(A, A_scale, B, B_scale):
    """vLLM's Triton block-FP8 GEMM (``w8a8_triton_block_scaled_mm``, its ``TritonFp8BlockScaledMMKernel``
    and the fallback of its others), on the operands as the Definition gives them: A's scales one
    per token and group of BLOCK_K columns, B's one per BLOCK_N x BLOCK_K block, both row-major."""
    return w8a8_triton_block_scaled_mm(A, B, A_scale, B_scale, [BLOCK_N, BLOCK_K], torch.bfloat16)
