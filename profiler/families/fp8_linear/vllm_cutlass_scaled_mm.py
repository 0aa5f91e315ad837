import torch
from vllm import _custom_ops as ops


def run(A, A_scale, B, B_scale):
    """vLLM's CUTLASS scaled-mm (``cutlass_scaled_mm``, its ``CutlassFP8ScaledMMLinearKernel``: what
    its CUDA build ran for Llama-3.1-8B-FP8 on an H200): A's scale one per tensor or per token, B's
    one per tensor or per channel, in any mix; the weight column-major (B.T of a row-major [N, K]),
    as vLLM keeps it."""
    return ops.cutlass_scaled_mm(A, B.T, A_scale.reshape(-1, 1), B_scale.reshape(1, -1), torch.bfloat16)
