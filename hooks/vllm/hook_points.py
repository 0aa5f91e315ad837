"""vLLM's hook points, found by name (vLLM 0.26 on the GPU hosts, 0.32 in CI; neither pinned),
each under its op family's key, and how each layer of a built model is judged.

Methods are patched on the class before the model is built, so CustomOp's ``forward`` (which
dispatches to the method it bound at ``__init__``) is wrapped once at the top, above every
backend-specific path.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from fi_profile.capture.dummy_routing import after_dummy_weights
from fi_profile.capture.layers import LayerRule, by_layer_class, seen
from fi_profile.capture.patching import HookPoint
from fi_profile.families import attention as attention_family
from fi_profile.families import (
    collective,
    embedding,
    fp8_linear,
    gdn,
    gemm,
    mamba,
    mla,
    moe,
    qk_norm_rope,
    rmsnorm,
    rope,
    sampling,
    sigmoid_gate_mul,
    silu_and_mul,
)
from fi_profile.hooks.vllm import attention, gated_attention, steps
from fi_profile.hooks.vllm import fp8_linear as vllm_fp8
from fi_profile.hooks.vllm import gdn as vllm_gdn
from fi_profile.hooks.vllm import mamba2 as vllm_mamba2
from fi_profile.hooks.vllm import mla as vllm_mla
from fi_profile.hooks.vllm import moe as vllm_moe


def _fused_qkv_a_proj(self: Any, input_: torch.Tensor) -> list:
    """DeepSeek's fused q/kv down-projection (``DeepSeekV2FusedQkvAProjLinear``): on Hopper and
    Blackwell a bf16 one runs vLLM's own GEMM (``dsv3_fused_a_gemm`` up to 16 tokens, else
    ``F.linear``) past its linear method; otherwise its method's ``apply`` is the hooked call."""
    if not getattr(self, "_use_min_latency_gemm", False):
        return []
    seen(self)
    return [gemm.call(input_, *gemm.layer_size(self))]


def _sampler(self: Any, logits: torch.Tensor, k: Optional[torch.Tensor], p: Optional[torch.Tensor]) -> list:
    return [sampling.call(logits, k is not None, p is not None)]


def _sampler_v1(self: Any, logits: torch.Tensor, sampling_metadata: Any) -> list:
    """The V1 Sampler's ``sample``: argmax for the greedy requests (computed over every row where
    any is greedy), top-k / top-p sampling for the random ones where they ask for it (the
    ``TopKTopPSampler`` it calls, nested, is not counted again)."""
    calls = [] if sampling_metadata.all_random else [sampling.greedy_call(logits)]
    if not sampling_metadata.all_greedy:
        calls.append(sampling.call(logits, sampling_metadata.top_k is not None, sampling_metadata.top_p is not None))
    return calls


def _sampler_v2(self: Any, logits: torch.Tensor, idx_mapping_np: np.ndarray) -> list:
    """The V2 model runner's own Sampler (vLLM's default on GPUs since 0.2x): top-k / top-p as its
    per-request states say, from their host copies (no device sync); all-greedy steps take argmax."""
    states, requests = self.sampling_states, idx_mapping_np
    if np.all(states.temperature.np[requests] == 0.0):
        return [sampling.greedy_call(logits)]
    top_k = bool(np.any(states.top_k.np[requests] != states.vocab_size))
    top_p = bool(np.any(states.top_p.np[requests] != 1.0))
    return [sampling.call(logits, top_k, top_p)]


_LAYERS = "vllm.model_executor.layers"
#: Qwen3-Next's and Qwen3.5's Gated DeltaNet layer (vLLM 0.3x; not in older versions)
_GDN_MODULE = f"{_LAYERS}.mamba.gdn.qwen_gdn_linear_attn"
#: Mamba-2's mixer and its gated norm
_MAMBA2_MODULE = f"{_LAYERS}.mamba.mamba_mixer2"

POINTS = [
    HookPoint(f"{_LAYERS}.layernorm", "RMSNorm", ("forward",), rmsnorm.KEY, rmsnorm.layer_calls),
    HookPoint(f"{_LAYERS}.layernorm", "GemmaRMSNorm", ("forward",), rmsnorm.KEY, rmsnorm.gemma_layer_calls),
    HookPoint(f"{_LAYERS}.layernorm", "RMSNormGated", ("forward",), rmsnorm.KEY, rmsnorm.gated_layer_calls,
              optional=True),
    HookPoint(_MAMBA2_MODULE, "Mixer2RMSNormGated", ("forward",), rmsnorm.KEY, rmsnorm.mixer2_gated_layer_calls,
              optional=True),
    HookPoint(f"{_LAYERS}.activation", "SiluAndMul", ("forward",), silu_and_mul.KEY, silu_and_mul.layer_calls),
    HookPoint(f"{_LAYERS}.activation", "GeluAndMul", ("forward",), silu_and_mul.KEY, silu_and_mul.gelu_layer_calls),
    HookPoint(f"{_LAYERS}.activation", "ReLUSquaredActivation", ("forward",), silu_and_mul.KEY, silu_and_mul.relu2_layer_calls,
              optional=True),
    HookPoint(f"{_LAYERS}.rotary_embedding.base", "RotaryEmbedding", ("forward",), rope.KEY, rope.layer_calls),
    HookPoint(f"{_LAYERS}.rotary_embedding.deepseek_scaling_rope", "DeepseekScalingRotaryEmbedding", ("forward",),
              rope.KEY, rope.layer_calls),
    # Qwen3-Next's and Qwen3.5's gated attention: on CUDA its q/k norms and RoPE in one fused kernel
    HookPoint("vllm.model_executor.models.qwen3_next", "Qwen3NextAttention", ("_project_qkv_gate",), qk_norm_rope.KEY,
              gated_attention.layer_calls, optional=True),
    # its output gate (sigmoid and product), watched while the layer runs eagerly; compiled, a
    # template before the output projection's GEMM call
    HookPoint("vllm.model_executor.models.qwen3_next", "Qwen3NextAttention", ("forward",), "sigmoid_gate_mul_layer",
              sigmoid_gate_mul.watched, around=True, optional=True, traced=gated_attention.traced_gate_calls,
              traced_before=gemm.KEY),
    # Qwen2-MoE's and Qwen3-Next's shared expert: its output times the sigmoid of its gate's logit
    # (watched eagerly, a template where compiled; recorded by the MoE call where an opaque op runs it)
    HookPoint("vllm.model_executor.models.qwen2_moe", "Qwen2MoeMLP", ("forward",), "sigmoid_gate_mul_layer",
              sigmoid_gate_mul.watched, around=True, optional=True, traced=vllm_moe.shared_mlp_traced_calls),
    HookPoint(f"{_LAYERS}.linear", "UnquantizedLinearMethod", ("apply",), gemm.KEY, gemm.linear_calls),
    # block-scale FP8 linear layers: the activations' quantization, then the GEMM
    HookPoint(f"{_LAYERS}.quantization.fp8", "Fp8LinearMethod", ("apply",), fp8_linear.KEY, vllm_fp8.linear_calls),
    HookPoint(f"{_LAYERS}.quantization.compressed_tensors.compressed_tensors", "CompressedTensorsLinearMethod",
              ("apply",), fp8_linear.KEY, vllm_fp8.linear_calls, optional=True),
    # an op of its own: where it runs its linear method instead, that method's GEMM is not nested in it
    HookPoint("vllm.model_executor.models.deepseek_v2", "DeepSeekV2FusedQkvAProjLinear", ("forward",),
              "fused_qkv_a_gemm", _fused_qkv_a_proj, optional=True),
    # lm_head: the logits projection, and the method it applies (nested calls count once)
    HookPoint(f"{_LAYERS}.logits_processor", "LogitsProcessor", ("_apply_head",), gemm.KEY, gemm.lm_head_calls,
              outside_forward=True),
    HookPoint(f"{_LAYERS}.vocab_parallel_embedding", "UnquantizedEmbeddingMethod", ("apply",), gemm.KEY, gemm.linear_calls),
    HookPoint(f"{_LAYERS}.vocab_parallel_embedding", "VocabParallelEmbedding", ("forward",), embedding.KEY,
              embedding.layer_calls),
    HookPoint(f"{_LAYERS}.attention.attention", "Attention", ("forward",), attention_family.KEY, attention.layer_calls,
              live=True, traced=attention.traced_layer_calls),
    HookPoint(f"{_LAYERS}.attention.mla_attention", "MLAAttention", ("forward",), mla.KEY, vllm_mla.layer_calls,
              live=True, traced=vllm_mla.traced_layer_calls),
    HookPoint(f"{_LAYERS}.attention.mla_attention", "MLACommonMetadataBuilder", ("build",), "step",
              vllm_mla.metadata_builder, optional=True, boundary=True),
    HookPoint(f"{_LAYERS}.fused_moe.runner.moe_runner", "MoERunner", ("forward",), moe.KEY, vllm_moe.layer_calls),
    # the recurrent layers: their core op (conv1d, recurrence) runs after the input projections and
    # before the gated norm, which is hooked on its own
    HookPoint(_GDN_MODULE, "QwenGatedDeltaNetAttention", ("forward",), gdn.KEY, vllm_gdn.layer_calls, live=True,
              traced=vllm_gdn.traced_layer_calls, optional=True, traced_before=rmsnorm.KEY),
    HookPoint(_MAMBA2_MODULE, "MambaMixer2", ("forward",), mamba.KEY, vllm_mamba2.layer_calls, live=True,
              traced=vllm_mamba2.traced_layer_calls, optional=True, traced_before=rmsnorm.KEY),
    *(
        HookPoint(f"vllm.v1.attention.backends.{module}", builder, ("build",), "step", attention.metadata_builder,
                  optional=True, boundary=True)
        for module, builder in (
            ("cpu_attn", "CPUAttentionMetadataBuilder"),
            ("triton_attn", "TritonAttentionMetadataBuilder"),
            ("flashinfer", "FlashInferMetadataBuilder"),
            ("flash_attn", "FlashAttentionMetadataBuilder"),
        )
    ),
    # the collectives of a tensor-parallel group (the all-reduce after row-parallel layers, the logits' all-gather)
    HookPoint("vllm.distributed.parallel_state", "GroupCoordinator", ("all_reduce",), collective.KEY,
              collective.group_all_reduce_calls, outside_forward=True),
    HookPoint("vllm.distributed.parallel_state", "GroupCoordinator", ("all_gather",), collective.KEY,
              collective.group_all_gather_calls, outside_forward=True),
    HookPoint("vllm.v1.sample.sampler", "Sampler", ("sample",), sampling.KEY, _sampler_v1, outside_forward=True),
    HookPoint("vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler",
              ("forward_native", "forward_cpu", "forward_cuda", "forward_hip", "forward_xpu"), sampling.KEY, _sampler,
              outside_forward=True),
    HookPoint("vllm.v1.worker.gpu.sample.sampler", "Sampler", ("sample",), sampling.KEY, _sampler_v2, optional=True,
              outside_forward=True),
    # dummy weights drawn (before vLLM turns them into its kernels' layout): a MoE model's biases zeroed
    HookPoint("vllm.model_executor.model_loader.dummy_loader", "DummyModelLoader", ("load_weights",), "dummy_routing",
              after_dummy_weights(vllm_moe.is_moe_layer), around=True, optional=True),
    # every engine step that schedules tokens runs a forward, which must be in the record
    HookPoint("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", ("execute_model",), "step", steps.engine_step, around=True),
    HookPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", ("execute_model",), "step", steps.engine_step, around=True,
              optional=True),
    # graph mode: each run of a compiled forward (and of a whole-model CUDA graph) in a step
    HookPoint("vllm.compilation.wrapper", "TorchCompileWithNoGuardsWrapper", ("__call__",), "compiled_forward",
              steps.compiled_forward, optional=True, boundary=True, raw=True),
    *(
        HookPoint(f"vllm.compilation.{module}", wrapper, ("__call__",), "compiled_forward", steps.cuda_graph_call,
                  optional=True, boundary=True, raw=True)
        for module, wrapper in (("cuda_graph", "CUDAGraphWrapper"), ("breakable_cudagraph", "BreakableCUDAGraphWrapper"))
    ),
    HookPoint("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager", ("run_fullgraph",), "compiled_forward",
              steps.full_graph_replay, optional=True, boundary=True),
]


def _logits_problem(layer: Any) -> Optional[str]:
    """The logits processor's cap and scale (``soft_cap``, ``scale``) beside its lm_head GEMM."""
    return gemm.logits_problem(layer, getattr(layer, "soft_cap", None), getattr(layer, "scale", None))


#: how each layer of a built model is judged (``run.not_covered``): the hooked layer classes by
#: their own rules; any other layer of vLLM's custom-op or attention bases is a class no hook knows
LAYER_RULES = [
    LayerRule(f"{_LAYERS}.layernorm:RMSNorm", rmsnorm.layer_problem),
    LayerRule(f"{_LAYERS}.layernorm:GemmaRMSNorm", rmsnorm.gemma_layer_problem),
    LayerRule(f"{_LAYERS}.layernorm:RMSNormGated", rmsnorm.gated_layer_problem),
    LayerRule(f"{_LAYERS}.activation:SiluAndMul", silu_and_mul.layer_problem),
    LayerRule(f"{_LAYERS}.activation:GeluAndMul", silu_and_mul.gelu_layer_problem),
    LayerRule(f"{_LAYERS}.activation:ReLUSquaredActivation", silu_and_mul.relu2_layer_problem),
    LayerRule(f"{_LAYERS}.rotary_embedding.base:RotaryEmbedding", rope.layer_problem),
    LayerRule(f"{_LAYERS}.rotary_embedding.deepseek_scaling_rope:DeepseekScalingRotaryEmbedding", rope.layer_problem),
    LayerRule(f"{_LAYERS}.attention.mla_attention:MLAAttention", vllm_mla.layer_problem),
    LayerRule(f"{_LAYERS}.mla:MultiHeadLatentAttentionWrapper", vllm_mla.wrapper_problem, container=True),
    # Qwen3-Next's gated attention: its output gate watched in its forward, its layers judged one by one
    LayerRule("vllm.model_executor.models.qwen3_next:Qwen3NextAttention", sigmoid_gate_mul.layer_problem("forward"),
              container=True),
    LayerRule("vllm.model_executor.models.qwen2_moe:Qwen2MoeMLP", sigmoid_gate_mul.layer_problem("forward"),
              container=True),
    LayerRule(f"{_GDN_MODULE}:QwenGatedDeltaNetAttention", vllm_gdn.layer_problem),
    LayerRule(f"{_MAMBA2_MODULE}:MambaMixer2", vllm_mamba2.layer_problem),
    LayerRule(f"{_MAMBA2_MODULE}:Mixer2RMSNormGated", rmsnorm.mixer2_gated_layer_problem),
    LayerRule(f"{_LAYERS}.attention_layer_base:AttentionLayerBase", attention.layer_problem),
    LayerRule(f"{_LAYERS}.fused_moe.runner.moe_runner:MoERunner", vllm_moe.layer_problem),
    LayerRule(f"{_LAYERS}.logits_processor:LogitsProcessor", _logits_problem),
    # an FP8 checkpoint's attention layers hold their KV-cache scales in a quantization method; the
    # cache's dtype is the layer's ``kv_cache_dtype``, judged by the attention rules
    LayerRule(f"{_LAYERS}.quantization.kv_cache:BaseKVCacheMethod", by_layer_class),
    vllm_fp8.LAYER_RULE,
    vllm_fp8.COMPRESSED_TENSORS_RULE,
]
KERNEL_LAYERS = [
    "vllm.model_executor.custom_op:CustomOp",
    "vllm.model_executor.custom_op:PluggableLayer",
    f"{_LAYERS}.attention_layer_base:AttentionLayerBase",
]
