"""SGLang's hook points, found by name (SGLang 0.5.23 in CI; neither it nor the GPU bundle's
0.5.16 pinned), each under its op family's key, and how each layer of a built model is judged.
Page size 1 (the request-to-token table's rows are the page ids: :mod:`.attention`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.dummy_routing import after_dummy_weights
from fi_profile.capture.layers import LayerRule, by_layer_class, recorded_elsewhere, require, seen, seen_weights
from fi_profile.capture.patching import HookPoint, span_only
from fi_profile.families import attention as attention_family
from fi_profile.families import (
    collective,
    embedding,
    fp8_linear,
    gemm,
    mla,
    moe,
    qk_rmsnorm,
    rmsnorm,
    rope,
    sampling,
    shared_expert_gate,
    sigmoid_gate_mul,
    silu_and_mul,
)
from fi_profile.families import gdn as gdn_family
from fi_profile.families import mamba as mamba_family
from fi_profile.hooks.sglang import attention, gdn, gemma3, steps
from fi_profile.hooks.sglang import fp8_linear as sglang_fp8
from fi_profile.hooks.sglang import mamba2 as sglang_mamba2
from fi_profile.hooks.sglang import mla as sglang_mla
from fi_profile.hooks.sglang import moe as sglang_moe


def _fused_qk_norm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                   eps: float = 1e-6) -> list:
    """SGLang's ``fused_inplace_qknorm`` (Qwen3's q/k norms on CUDA, one kernel for both, called with
    the RMSNorm layers' weights instead of the layers)."""
    seen_weights(q_weight, k_weight)
    return [qk_rmsnorm.call(q, k, float(eps))]


def _fused_a_gemm(layer: Any, hidden_states: torch.Tensor) -> list:
    """DeepSeek's fused q/kv down-projection (and q_b of some shapes) on Hopper and newer: up to 16
    tokens SGLang runs its own GEMM (``dsv3_fused_a_gemm``) on the bf16 layer's weight, past its
    linear method, else it calls the layer; one GEMM either way (the method's ``apply`` nested)."""
    seen(layer)
    require("LoRA adapters on a fused-A GEMM layer (no Definition computes it)" if getattr(layer, "set_lora", False)
            else None)
    return [gemm.call(hidden_states, *gemm.layer_size(layer))]


def _group_size(use_attn_tp_group: bool = True) -> int:
    """The GPUs of the group SGLang's fused all-reduce runs in: attention's TP group, else the MoE's
    (its expert-parallel group where experts are spread, else its TP group), as its norm reads them."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if use_attn_tp_group:
        return int(parallel.attn_tp_size)
    return int(parallel.moe_ep_size if parallel.moe_ep_size > 1 else parallel.moe_tp_size)


def _all_reduce_fused_add_rmsnorm(input_tensor: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                  eps: float = 1e-6, use_attn_tp_group: bool = True) -> list:
    """SGLang's all-reduce fused with the residual add and RMSNorm after it (FlashInfer's
    ``allreduce_fusion``, on Hopper and newer at TP > 1), called with the norm layer's weight in
    place of the layer's forward and the all-reduce before it. SGLang calls it only where its
    workspace is up; it declines non-contiguous tensors (SGLang then runs the norm layer, whose
    own hook records it), and so records nothing for them."""
    if not (input_tensor.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()):
        return []
    seen_weights(weight)
    return [collective.fused_add_rmsnorm_call(input_tensor, residual, float(eps), _group_size(use_attn_tp_group))]


def _symmetric_memory_all_gather(x: torch.Tensor) -> list:
    """SGLang's all-gather of the logits among the TP group (a Triton kernel on symmetric memory,
    else ``GroupCoordinator.all_gather``, nested)."""
    from sglang.srt.runtime_context import get_parallel

    return [collective.all_gather_call(x, int(get_parallel().tp_size))]


def _tiny_gemm_linear(self: Any, x: torch.Tensor) -> list:
    """gpt-oss's router (``TinyGemmLinear``, a ``ReplicatedLinear``): up to 128 bf16 tokens on
    Hopper and Blackwell it runs FlashInfer's ``tinygemm_bf16`` past its linear method (the decode
    steps' router GEMMs were missing from the record), else its method's ``apply``, nested here:
    one GEMM either way, with the bias it adds."""
    seen(self)
    if recorded_elsewhere(self):
        return []
    return [gemm.call(x, *gemm.layer_size(self), bias=getattr(self, "bias", None) is not None
                      and not bool(getattr(self, "skip_bias_add", False)))]


def _sampler(self: Any, logits_output: Any, sampling_info: Any) -> list:
    if sampling_info.is_all_greedy:
        return [sampling.greedy_call(logits_output.next_token_logits)]
    top_k, top_p = bool(sampling_info.need_top_k_sampling), bool(sampling_info.need_top_p_sampling)
    return [sampling.call(logits_output.next_token_logits, top_k, top_p)]


_LAYERS = "sglang.srt.layers"
_EXECUTOR = "sglang.srt.model_executor"
_MLA = "sglang.srt.models.deepseek_common.attention_forward_methods"
_GEMMA3 = "sglang.srt.models.gemma3_causal"
_FLA = "sglang.kernels.ops.attention.fla"
_MAMBA = f"{_LAYERS}.attention.mamba"
_MAMBA2 = f"{_MAMBA}.mamba"

POINTS = [
    HookPoint(f"{_LAYERS}.layernorm", "RMSNorm", ("forward",), rmsnorm.KEY, rmsnorm.layer_calls),
    HookPoint(f"{_LAYERS}.layernorm", "GemmaRMSNorm", ("forward",), rmsnorm.KEY, gemma3.norm_calls, optional=True),
    HookPoint(f"{_LAYERS}.layernorm", "Gemma3RMSNorm", ("forward",), rmsnorm.KEY, gemma3.norm_calls, optional=True),
    HookPoint(f"{_LAYERS}.activation", "SiluAndMul", ("forward",), silu_and_mul.KEY, silu_and_mul.layer_calls),
    HookPoint(f"{_LAYERS}.activation", "GeluAndMul", ("forward",), silu_and_mul.KEY, silu_and_mul.gelu_layer_calls),
    HookPoint(f"{_LAYERS}.activation", "ReLU2", ("forward",), silu_and_mul.KEY, silu_and_mul.relu2_layer_calls,
              optional=True),
    HookPoint(f"{_LAYERS}.rotary_embedding.base", "RotaryEmbedding", ("forward",), rope.KEY, rope.layer_calls),
    # Gemma-3's Hugging Face RoPE: cos/sin from the model's own tables, each layer rotating by the
    # one its kind takes (the model and layer forwards say which); its own scaled embedding
    HookPoint(_GEMMA3, "Gemma3TextModel", ("forward",), "gemma3_rope_tables", gemma3.model_forward, around=True,
              optional=True),
    HookPoint(_GEMMA3, "Gemma3DecoderLayer", ("forward",), "gemma3_layer", gemma3.decoder_layer_forward, around=True,
              optional=True),
    HookPoint(_GEMMA3, "", ("apply_rotary_pos_emb",), rope.KEY, gemma3.rotation_calls, optional=True),
    # Qwen3-Next's full-attention layers: their output gate (sigmoid and product in PyTorch on CUDA
    # and CPUs) watched while the layer's attention runs
    # (a span: the layer's own kernels, its query and gate split out of the QKV projection, are its
    # attention call's)
    HookPoint("sglang.srt.models.qwen3_next", "Qwen3HybridAttentionDecoderLayer", ("self_attention",),
              "sigmoid_gate_mul_layer", sigmoid_gate_mul.watched, around=True, optional=True,
              span=attention_family.KEY),
    HookPoint(_GEMMA3, "Gemma3RotaryEmbedding", ("forward",), rope.KEY, gemma3.table_prologue_calls, prologue=True,
              optional=True),
    HookPoint(_GEMMA3, "Gemma3TextScaledWordEmbedding", ("forward",), embedding.KEY, gemma3.embedding_calls,
              optional=True),
    HookPoint(f"{_LAYERS}.quantization.unquant", "UnquantizedLinearMethod", ("apply",), gemm.KEY, gemm.linear_calls),
    # a linear layer of gpt-oss's with a GEMM of its own (its method's apply, where it falls back, nested)
    HookPoint("sglang.srt.models.gpt_oss", "TinyGemmLinear", ("forward",), gemm.KEY, _tiny_gemm_linear, optional=True),
    # block-scale FP8 linear layers: the activations' quantization, then the GEMM
    HookPoint(f"{_LAYERS}.quantization.fp8", "Fp8LinearMethod", ("apply",), fp8_linear.KEY, sglang_fp8.linear_calls),
    HookPoint(f"{_LAYERS}.quantization.compressed_tensors.compressed_tensors", "CompressedTensorsLinearMethod",
              ("apply",), fp8_linear.KEY, sglang_fp8.linear_calls, optional=True),
    # lm_head: the logits projection, and the method it may apply (nested calls count once)
    HookPoint(f"{_LAYERS}.logits_processor", "LogitsProcessor", ("_compute_lm_head",), gemm.KEY, gemm.lm_head_calls),
    # the processor's own kernels around it (the logits cast to float32 into the sampler's buffer,
    # inside the decode graphs) are the lm_head's: its cap and scale are judged with it (``_logits_problem``)
    HookPoint(f"{_LAYERS}.logits_processor", "LogitsProcessor", ("_get_logits",), "lm_head_layer", span_only,
              around=True, optional=True, span=gemm.KEY),
    HookPoint(f"{_LAYERS}.quantization.unquant", "UnquantizedEmbeddingMethod", ("apply",), gemm.KEY, gemm.linear_calls),
    HookPoint(f"{_LAYERS}.vocab_parallel_embedding", "VocabParallelEmbedding", ("forward",), embedding.KEY,
              embedding.layer_calls),
    HookPoint(f"{_LAYERS}.radix_attention", "RadixAttention", ("forward",), attention_family.KEY, attention.layer_calls,
              live=True, traced=attention.captured_layer_calls),
    # Gated DeltaNet (Qwen3-Next): a layer's conv1d and recurrence in each step, and its gated norm
    HookPoint(f"{_LAYERS}.radix_linear_attention", "RadixLinearAttention", ("forward",), gdn_family.KEY,
              gdn.layer_calls, live=True, traced=gdn.captured_layer_calls, optional=True),
    # the Gated DeltaNet layer around it: its own kernels (its projections' split and concatenation
    # for the conv1d, ``fused_qkvzba_split_reshape_cat`` on CUDA, PyTorch's copies on CPUs) are its
    # recurrence's, as vLLM's hook on the layer has them
    HookPoint("sglang.srt.models.qwen3_next", "Qwen3GatedDeltaNet", ("forward",), "gdn_layer", span_only,
              around=True, optional=True, span=gdn_family.KEY),
    HookPoint(f"{_FLA}.fused_norm_gate", "FusedRMSNormGated", ("forward",), rmsnorm.KEY, gdn.fused_norm_calls,
              optional=True),
    HookPoint(f"{_FLA}.layernorm_gated", "RMSNorm", ("forward",), rmsnorm.KEY, gdn.gated_norm_calls, optional=True),
    # Mamba-2's mixer (Nemotron-H, Granite-4.0-H, Falcon-H1): its conv1d and recurrence in each step,
    # and its gated norm (the gate first, a norm per group)
    HookPoint(_MAMBA2, "MambaMixer2", ("forward",), mamba_family.KEY, sglang_mamba2.layer_calls, live=True,
              traced=sglang_mamba2.captured_layer_calls, optional=True, traced_before=rmsnorm.KEY),
    # the backend's call around it: its tracking of the states for the prefix cache after the mixer
    # (``track_mamba_states_if_needed`` on CUDA) is the recurrence's, as the Gated DeltaNet backend's is
    HookPoint(f"{_LAYERS}.attention.hybrid_linear_attn_backend", "Mamba2AttnBackend", ("forward",), "mamba_layer",
              span_only, around=True, optional=True, span=mamba_family.KEY),
    HookPoint(f"{_MAMBA}.mixer2_rms_norm_gated", "Mixer2RMSNormGated", ("forward",), rmsnorm.KEY,
              rmsnorm.mixer2_gated_layer_calls, optional=True),
    # DeepSeek's MLA: the absorbed form, the up-projected prefill and the latent write before it
    # (their RadixAttention layers run nested, recording nothing of their own)
    HookPoint(f"{_MLA}.forward_mla", "DeepseekMLAForwardMixin", ("forward_absorb_core",), mla.KEY,
              sglang_mla.absorbed_calls, live=True, traced=sglang_mla.captured_absorbed_calls,
              nested=(attention_family.KEY,)),
    HookPoint(f"{_MLA}.forward_mha", "DeepseekMHAForwardMixin", ("forward_normal_core",), mla.KEY,
              sglang_mla.ragged_calls, live=True, traced=sglang_mla.captured_ragged_calls,
              nested=(attention_family.KEY,)),
    HookPoint(f"{_MLA}.forward_mha", "DeepseekMHAForwardMixin", ("_set_mla_kv_buffer",), mla.KEY,
              sglang_mla.latent_write_calls, live=True, traced=sglang_mla.captured_latent_write_calls),
    HookPoint(f"{_MLA}.forward_mha", "DeepseekMHAForwardMixin", ("_concat_and_cast_mha_k",), mla.KEY,
              sglang_mla.ragged_prologue_calls, prologue=True),
    HookPoint("sglang.srt.models.deepseek_v2", "MoEGate", ("forward",), "moe_routing", sglang_moe.gate_calls),
    # a function DeepSeek's attention calls with its bf16 down-projection (looked up in the model's module)
    HookPoint("sglang.srt.models.deepseek_v2", "", ("linear_with_fused_a_gemm",), "fused_a_gemm", _fused_a_gemm,
              nested=(gemm.KEY,)),
    # the router's top-k: where it records nothing (the routing is part of the MoE Definition), its
    # kernels in a CUDA graph are the experts' call's after it
    HookPoint(f"{_LAYERS}.moe.topk", "TopK", ("forward",), "moe_routing", sglang_moe.routing_calls, feeds=moe.KEY),
    # Qwen2-MoE's block fusing its shared expert into the experts (Qwen3-Next's default on CUDA): its
    # gate is a torch nn.Linear (a GEMM call), whose logits' sigmoid and the append to the top-k are
    # the MoE call's (their kernels, after the GEMM's, too)
    HookPoint("sglang.srt.models.qwen2_moe", "Qwen2MoeSparseMoeBlock", ("_append_shared_to_topk_output",),
              "moe_shared_gate", sglang_moe.fused_shared_gate_calls, feeds=moe.KEY, optional=True),
    HookPoint("torch.nn.modules.linear", "Linear", ("forward",), gemm.KEY, sglang_moe.torch_linear_calls),
    # a kernel function Qwen2-MoE's block calls (looked up in its module) with its shared expert's output
    HookPoint("sglang.srt.models.qwen2_moe", "", ("fused_gate_sigmoid_mul_add",), shared_expert_gate.KEY,
              sglang_moe.shared_expert_gate_calls, optional=True),
    HookPoint(f"{_LAYERS}.moe.fused_moe_triton.layer", "FusedMoE", ("forward",), moe.KEY, sglang_moe.layer_calls,
              nested=(silu_and_mul.KEY, gemm.KEY)),
    # a kernel function the models call with the norm layers' weights (looked up in this module)
    HookPoint("sglang.srt.models.utils", "", ("fused_inplace_qknorm",), qk_rmsnorm.KEY, _fused_qk_norm, optional=True),
    # the collectives of a tensor-parallel group: the all-reduce after row-parallel layers (or fused with
    # the next norm), the logits' all-gather
    HookPoint("sglang.srt.distributed.parallel_state", "GroupCoordinator", ("all_reduce",), collective.KEY,
              collective.group_all_reduce_calls, outside_forward=True),
    HookPoint("sglang.srt.distributed.parallel_state", "GroupCoordinator", ("all_gather",), collective.KEY,
              collective.group_all_gather_calls, outside_forward=True),
    HookPoint("sglang.srt.distributed.device_communicators.triton_symm_mem_ag", "MultimemAllGatherer", ("__call__",),
              collective.KEY, _symmetric_memory_all_gather, optional=True, outside_forward=True),
    # a function the norm layers call at TP > 1 on Hopper and newer (looked up in its module at each call)
    HookPoint(f"{_LAYERS}.flashinfer_comm_fusion", "", ("flashinfer_allreduce_residual_rmsnorm",), collective.KEY,
              _all_reduce_fused_add_rmsnorm, optional=True),
    HookPoint(f"{_LAYERS}.sampler", "Sampler", ("forward",), sampling.KEY, _sampler, outside_forward=True),
    HookPoint(f"{_EXECUTOR}.model_runner", "ModelRunner", ("forward",), "step", steps.model_step, around=True),
    # dummy weights drawn (before SGLang turns them into its kernels' layout): a MoE model's biases zeroed
    HookPoint("sglang.srt.model_loader.loader", "", ("initialize_dummy_weights",), "dummy_routing",
              after_dummy_weights(sglang_moe.is_moe_layer), around=True, optional=True),
    # graph mode: a graph runner runs a step; the calls each CUDA graph captured, and each replay of it
    *(
        HookPoint(f"{_EXECUTOR}.{module}", runner, ("execute",), "graph_step", steps.graph_runner_runs, boundary=True)
        for module, runner in (("runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner"),
                               ("runner.prefill_cuda_graph_runner", "PrefillCudaGraphRunner"),
                               ("cpu_graph_runner", "CPUGraphRunner"))
    ),
    *(
        point
        for module, backend in (("full_cuda_graph_backend", "FullCudaGraphBackend"),
                                ("breakable_cuda_graph_backend", "BreakableCudaGraphBackend"))
        for point in (
            HookPoint(f"{_EXECUTOR}.runner_backend.{module}", backend, ("capture_one",), "graph_capture",
                      steps.graph_capture, around=True),
            HookPoint(f"{_EXECUTOR}.runner_backend.{module}", backend, ("replay",), "graph_replay", steps.graph_replay,
                      boundary=True),
        )
    ),
]


def _logits_problem(layer: Any) -> Optional[str]:
    """The logits processor's cap and scale (``final_logit_softcapping``, ``logit_scale``) beside its lm_head GEMM."""
    return gemm.logits_problem(layer, getattr(layer, "final_logit_softcapping", None), getattr(layer, "logit_scale", None))


#: how each layer of a built model is judged (``run.not_covered``): the hooked layer classes by
#: their own rules; any other layer of SGLang's op bases (they moved between versions) is a class
#: no hook knows
LAYER_RULES = [
    LayerRule(f"{_LAYERS}.layernorm:RMSNorm", rmsnorm.layer_problem),
    LayerRule(f"{_LAYERS}.layernorm:GemmaRMSNorm", rmsnorm.gemma_layer_problem),
    LayerRule(f"{_LAYERS}.layernorm:Gemma3RMSNorm", rmsnorm.gemma_layer_problem),
    LayerRule(f"{_LAYERS}.activation:SiluAndMul", silu_and_mul.layer_problem),
    LayerRule(f"{_LAYERS}.activation:GeluAndMul", silu_and_mul.gelu_layer_problem),
    LayerRule(f"{_LAYERS}.activation:ReLU2", silu_and_mul.relu2_layer_problem),
    LayerRule(f"{_LAYERS}.rotary_embedding.base:RotaryEmbedding", rope.layer_problem),
    # Gemma-3's RoPE tables: judged, not marked (on SGLang's AMX CPU path its layers' RotaryEmbedding
    # runs instead, and the tables are unused)
    LayerRule(f"{_GEMMA3}:Gemma3RotaryEmbedding", gemma3.table_problem, container=True),
    # Qwen3-Next's gated attention layer: its output gate watched in its self_attention
    LayerRule("sglang.srt.models.qwen3_next:Qwen3HybridAttentionDecoderLayer",
              sigmoid_gate_mul.layer_problem("self_attention"), container=True),
    LayerRule(f"{_GEMMA3}:Gemma3TextScaledWordEmbedding", gemma3.embedding_problem),
    sglang_mla.LAYER_RULE,
    LayerRule(f"{_LAYERS}.radix_attention:RadixAttention", attention.layer_problem),
    LayerRule(f"{_LAYERS}.radix_linear_attention:RadixLinearAttention", gdn.layer_problem),
    LayerRule(f"{_FLA}.fused_norm_gate:FusedRMSNormGated", gdn.fused_norm_problem),
    LayerRule(f"{_FLA}.layernorm_gated:RMSNorm", gdn.gated_norm_problem),
    LayerRule(f"{_MAMBA2}:MambaMixer2", sglang_mamba2.layer_problem),
    LayerRule(f"{_MAMBA}.mixer2_rms_norm_gated:Mixer2RMSNormGated", rmsnorm.mixer2_gated_layer_problem),
    LayerRule(f"{_LAYERS}.moe.topk:TopK", sglang_moe.routing_problem),
    LayerRule("sglang.srt.models.deepseek_v2:MoEGate", sglang_moe.gate_problem),
    LayerRule("torch.nn.modules.linear:Linear", sglang_moe.one_output_linear_problem),
    LayerRule(f"{_LAYERS}.logits_processor:LogitsProcessor", _logits_problem),
    sglang_fp8.LAYER_RULE,
    sglang_fp8.COMPRESSED_TENSORS_RULE,
    LayerRule(f"{_LAYERS}.quantization.fp8:Fp8MoEMethod", sglang_moe.fp8_block_problem),
    LayerRule(f"{_LAYERS}.quantization.mxfp4:Mxfp4MoEMethod", sglang_moe.mxfp4_layer_problem),
    # an FP8 checkpoint's attention layers hold their KV-cache scales in a quantization method; the
    # cache's dtype is the engine's (the attention hooks judge it at each call)
    LayerRule(f"{_LAYERS}.quantization.kv_cache:BaseKVCacheMethod", by_layer_class),
]
KERNEL_LAYERS = [
    "sglang.kernels.fused_op:BaseFusedOp",
    "sglang.srt.layers.utils.multi_platform:MultiPlatformOp",
    "sglang.srt.custom_op:CustomOp",
    f"{_LAYERS}.radix_attention:RadixAttention",
    # linear attention and the gated norms of FLA's kernels: plain modules, judged by their rules
    f"{_LAYERS}.radix_linear_attention:RadixLinearAttention",
    f"{_FLA}.fused_norm_gate:FusedRMSNormGated",
    f"{_FLA}.layernorm_gated:RMSNorm",
    # Mamba-2's mixer (Nemotron-H, Granite-4.0-H, Falcon-H1): a plain module, judged by its rule
    f"{_MAMBA2}:MambaMixer2",
]
