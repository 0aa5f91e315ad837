import torch
from sglang.srt.layers.quantization.fp8_utils import w8a8_block_fp8_matmul_triton

BLOCK_N = 128
BLOCK_K = 128


def run(A, A_scale, B, B_scale):
    """SGLang's Triton block-FP8 GEMM (``w8a8_block_fp8_matmul_triton``: what its
    ``triton_w8a8_block_fp8_linear`` runs where neither DeepGEMM nor a Blackwell or SM120 kernel
    is there, Hopper without DeepGEMM among them), on the operands as the Definition gives them:
    A's scales one per token and group of BLOCK_K columns, B's one per BLOCK_N x BLOCK_K block,
    both row-major, as SGLang passes them."""
    return w8a8_block_fp8_matmul_triton(A, B, A_scale, B_scale, [BLOCK_N, BLOCK_K], output_dtype=torch.bfloat16)
