"""A fused MoE layer with FP8 block-scale experts (DeepSeek-V3/R1, Qwen3-FP8: 128 x 128 weight
blocks, activations quantized per token and group of 128 columns), in flashinfer-trace's interface
(its ``moe_fp8_block_scale_*`` Definitions): FP8 hidden states and their scales, FP8 expert weights
and their block scales, gemm1 holding each expert's [up; gate].

The engines quantize the layer's input in a kernel of its own before the experts run, so a layer
is two calls, as an FP8 linear layer is: the per-token-group quantization, then the MoE."""

from __future__ import annotations

from typing import Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import SHORT_DTYPES, KernelCall, cached_definition, rows
from fi_profile.catalog import shipped_definition
from fi_profile.families import fp8_linear
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

#: the block the Definitions dequantize with (flashinfer-trace's: weights 128 x 128, activations 1 x 128)
BLOCK = 128

TEMPLATES = {
    "ds_routing": "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e256_h7168_i2048",
    "ds_routing_shared": "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e256_h7168_i2048_shared1",
    "renorm": "moe_fp8_block_scale_renorm_topk8_e128_h2048_i768",  # flashinfer-trace's, as shipped
}
#: the input dtypes the templates (flashinfer-trace's) take; another is said in the name
_DEFAULT_DTYPES = {"ds_routing": {"routing_logits": DType.float32, "routing_bias": DType.bfloat16},
                   "renorm": {"routing_logits": DType.bfloat16}}
_FP8_INPUTS = ("hidden_states", "gemm1_weights", "gemm2_weights")


def rounds_through(definition: Definition) -> Optional[torch.dtype]:
    """FP8 experts' kernels quantize the SwiGLU output per token group before gemm2, which the
    references (flashinfer-trace's among them) keep in float32: FP8's precision bounds the check."""
    spec = definition.inputs.get("gemm2_weights")
    return torch.float8_e4m3fn if spec is not None and spec.dtype is DType.float8_e4m3fn else None


def _blocks(size: int) -> int:
    return -(-size // BLOCK)


def problems(hidden: int, intermediate: int, dtype: torch.dtype, *, deepseek: bool, renormalize: bool,
             shared_experts: int, expert_parallel: bool) -> list[str]:
    """What an FP8 block-scale MoE layer does that no such Definition computes, in words."""
    return [what for what, applies in {
        f"FP8 block-scale experts with {schema_dtype(dtype).value} activations": dtype != torch.bfloat16,
        f"FP8 block-scale experts of sizes {hidden} x {intermediate} (not whole 128-blocks)":
            hidden % BLOCK != 0 or intermediate % BLOCK != 0,
        "FP8 block-scale experts with a softmax top-k router that does not renormalize": not deepseek and not renormalize,
        "FP8 block-scale experts with fused shared experts beside expert parallelism": bool(shared_experts) and expert_parallel,
        "FP8 block-scale experts with a softmax top-k router under expert parallelism": not deepseek and expert_parallel,
        f"FP8 block-scale experts with {shared_experts} fused shared experts": shared_experts > 1,
    }.items() if applies]


def calls(hidden_states: torch.Tensor, routing_logits: torch.Tensor, *, num_experts: int, top_k: int,
          intermediate_size: int, n_group: Optional[int] = None, topk_group: Optional[int] = None,
          routing_bias: Optional[torch.Tensor] = None, routed_scaling_factor: float = 1.0,
          shared_experts: int = 0, local_offset: int = 0, local_count: Optional[int] = None,
          power_of_two_scales: bool = False) -> list[KernelCall]:
    """The layer's two calls: its input's per-token-group quantization (its scales rounded up to
    powers of two where ``power_of_two_scales``: DeepGEMM's UE8M0), then the MoE on the FP8
    input, with DeepSeek's routing (``n_group``, ``topk_group``, the correction bias, the routed
    scaling factor; ``shared_experts`` fused after the routed ones; the rank's experts
    ``local_offset`` .. ``+ local_count`` under expert parallelism) or softmax top-k renormalized."""
    hidden = hidden_states.shape[-1]
    tokens = rows(hidden_states, hidden)
    local = num_experts if local_count is None else local_count
    deepseek = n_group is not None
    key = ("moe_fp8_block", num_experts, local, top_k, hidden, intermediate_size, n_group, topk_group, shared_experts,
           routing_logits.dtype, None if routing_bias is None else routing_bias.dtype)

    def build() -> Definition:
        consts = {"num_local_experts": local, "hidden_size": hidden, "intermediate_size": intermediate_size,
                  "gemm1_out_size": 2 * intermediate_size, "num_hidden_blocks": _blocks(hidden),
                  "num_intermediate_blocks": _blocks(intermediate_size),
                  "num_gemm1_out_blocks": _blocks(2 * intermediate_size)}
        dtypes = {name: DType.float8_e4m3fn for name in _FP8_INPUTS}
        dtypes["routing_logits"] = schema_dtype(routing_logits.dtype)
        shape = f"e{local}_h{hidden}_i{intermediate_size}"
        if not deepseek:
            name = f"moe_fp8_block_scale_renorm_topk{top_k}_{shape}{_dtypes_said('renorm', dtypes)}"
            return definition_for(TEMPLATES["renorm"], name, {**consts, "top_k": top_k}, DType.bfloat16,
                                  {"E": local, "H": hidden, "I": intermediate_size, "TOP_K": top_k}, dtypes)
        dtypes["routing_bias"] = schema_dtype(routing_bias.dtype)
        consts["num_experts"] = num_experts
        template = "ds_routing"
        extra = _dtypes_said("ds_routing", dtypes)
        if shared_experts:
            consts.update(num_shared_experts=shared_experts, num_weight_experts=local + shared_experts)
            template, extra = "ds_routing_shared", f"_shared{shared_experts}{extra}"
        bare = f"moe_fp8_block_scale_ds_routing_topk{top_k}_ng{n_group}_kg{topk_group}_{shape}{extra}"
        return definition_for(TEMPLATES[template], _unshadowed(bare, num_experts, local), consts, DType.bfloat16,
                              {"TOP_K": top_k, "N_GROUP": n_group, "TOPK_GROUP": topk_group}, dtypes)

    definition = cached_definition(key, build)
    scalars = {"local_expert_offset": local_offset, "routed_scaling_factor": float(routed_scaling_factor)} if deepseek else {}
    return [fp8_linear.quant_call(tokens, hidden, BLOCK, hidden_states.dtype, power_of_two_scales),
            KernelCall(definition, {"seq_len": tokens}, scalars=scalars)]


def _dtypes_said(routing: str, dtypes: dict[str, DType]) -> str:
    """``_logits_fp32``-style suffixes for the inputs whose dtype is not the template's."""
    return "".join(f"_{name.removeprefix('routing_')}_{SHORT_DTYPES.get(dtype, dtype.value)}"
                   for name, dtype in dtypes.items()
                   if name in _DEFAULT_DTYPES[routing] and dtype is not _DEFAULT_DTYPES[routing][name])


def _unshadowed(name: str, num_experts: int, local: int) -> str:
    """flashinfer-trace names a DeepSeek-routed FP8 MoE by its local experts alone (``e32``: DeepSeek-V3
    at EP=8): a name a shipped Definition holds for another split gets ``_ep{N}`` (``_ep1`` unsplit)."""
    shipped = shipped_definition(name)
    if shipped is None and local == num_experts:
        return name
    if shipped is not None and shipped.const_axes.get("num_experts") == num_experts:
        return name
    return f"{name}_ep{num_experts // local}"
