from sglang.srt.layers.quantization.fp8_utils import per_token_group_quant_fp8

GROUP_SIZE = 128

OUTPUTS = ("x_q", "x_scale")


def run(x):
    """SGLang's per-token-group FP8 quantization (``per_token_group_quant_fp8``, sgl-kernel's on
    CUDA: what its ``triton_w8a8_block_fp8_linear`` runs before the block GEMM), its scales
    row-major, one per token and group of GROUP_SIZE columns."""
    return per_token_group_quant_fp8(x.contiguous(), GROUP_SIZE, column_major_scales=False)
