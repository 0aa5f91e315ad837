"""SGLang's Gated DeltaNet layers (Qwen3-Next's ``RadixLinearAttention`` on its ``GDNAttnBackend``):
each step's causal conv1d as a ``causal_conv1d_*`` call and its recurrence as a ``gdn_decode_*``
or ``gdn_prefill_*`` call, read from the step's ForwardBatch and the backend's metadata (the
requests' state slots); and the gated norm after it (``FusedRMSNormGated``, or FLA's gated
``RMSNorm`` where SGLang builds it) as ``gated_rmsnorm_*``.

SGLang runs a step's requests alike: a decode step's conv1d update and recurrence over its
one-token requests, an extend step's conv1d and chunked rule over all of them (SGLang does not mix
decodes into a prefill's recurrence). Speculative steps (``gdn_mtp_*``) and multi-item scoring are
named errors. In a CUDA graph or a traced prefill, the calls of each replay are built from that
step's batch, as the attention layers' are."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.layers import KnownAttributes, judged_once, require, seen, seen_weights
from fi_profile.families import causal_conv1d, gdn, rmsnorm
from fi_profile.hooks.sglang.attention import STEP
from fi_profile.hooks.sglang.recurrent_state import linear_backend, query_starts

#: the linear-attention backends whose kernels the gdn and causal_conv1d Definitions compute
GDN_BACKENDS = ("GDNAttnBackend",)
#: what the hook knows of a ``RadixLinearAttention``'s attributes (SGLang 0.5.16 and 0.5.23): any
#: other is listed by name; ``lower_bound`` (Kimi's KDA gate) must be unset
LAYER_ATTRIBUTES = KnownAttributes(
    read=frozenset({"num_q_heads", "num_k_heads", "num_v_heads", "head_q_dim", "head_k_dim", "head_v_dim", "q_dim",
                    "k_dim", "v_dim", "conv_weights", "bias", "activation", "A_log", "dt_bias"}),
    neutral={"lower_bound": None},
    inert=frozenset({"layer_id"}),
)


def layer_problem(layer: Any) -> Optional[str]:
    """Why a ``RadixLinearAttention`` layer is no gdn Definition's (its class, sizes, attributes the
    hook does not know), or its conv1d no causal_conv1d one's; None if both are."""
    name = type(layer).__name__
    if name != "RadixLinearAttention":
        return f"{name} (a linear attention layer class no Definition computes)"
    unknown = LAYER_ATTRIBUTES.problems(layer)
    if unknown:
        return f"{name} with {', '.join(unknown)} (no Definition computes it)"
    if int(layer.num_q_heads) != int(layer.num_k_heads) or int(layer.head_q_dim) != int(layer.head_k_dim):
        return f"{name} with {layer.num_q_heads} query and {layer.num_k_heads} key heads (the gdn Definitions share them)"
    problem = gdn.layer_problem(*_sizes(layer)) or causal_conv1d.layer_problem(layer.activation)
    return f"{name}'s {problem}" if problem else None


def _sizes(layer: Any) -> tuple[int, int, int, int]:
    """Key heads, value heads (SGLang's layer holds them per rank), key and value head sizes."""
    return int(layer.num_k_heads), int(layer.num_v_heads), int(layer.head_k_dim), int(layer.head_v_dim)


def _backend_problem(backend: Any) -> Optional[str]:
    name = type(backend).__name__
    if name not in GDN_BACKENDS:
        return f"RadixLinearAttention on SGLang's {name} (a linear attention backend no Definition computes)"
    if getattr(backend, "mis_metadata", None) is not None:
        return "RadixLinearAttention in a multi-item scoring step (SGLang's GDN MIS path: no Definition computes it)"
    return None


def _calls(layer: Any, batch: Any, dtype: torch.dtype) -> list[KernelCall]:
    backend = linear_backend()
    if backend is None:
        raise RuntimeError("the step's model runner is unknown: its linear attention backend holds the state slots")
    require(_backend_problem(backend) or gdn.layer_problem(*_sizes(layer), dtype)
            or causal_conv1d.layer_problem(layer.activation, dtype))
    mode = batch.forward_mode
    if mode.is_target_verify() or getattr(mode, "is_draft_extend", lambda: False)():
        raise NotImplementedError("Gated DeltaNet's speculative (multi-token) steps: gdn_mtp_* is not captured yet")
    if not (mode.is_decode() or mode.is_extend()):
        return []  # idle and dummy steps run no layer work
    slots_of = backend.forward_metadata.mamba_cache_indices
    conv = (int(layer.q_dim) + int(layer.k_dim) + int(layer.v_dim), int(layer.conv_weights.shape[-1]),
            str(layer.activation), _conv_slots(backend, layer))
    heads, v_heads, _, _ = _sizes(layer)
    bias = layer.bias is not None
    if mode.is_decode():
        requests = int(batch.batch_size)
        slots = lambda: slots_of[:requests].to(torch.int32)  # noqa: E731  (gathered for a kept workload only)
        return [causal_conv1d.decode_call(*conv, requests, slots, bias), *gdn.step_calls(heads, v_heads, requests, None)]
    starts = query_starts(batch.extend_seq_lens_cpu)
    requests = len(starts) - 1
    prefix = batch.extend_prefix_lens
    return [causal_conv1d.prefill_call(*conv, starts, lambda: slots_of[:requests].to(torch.int32),
                                       lambda: (prefix[:requests] > 0).clone(), bias),
            *gdn.step_calls(heads, v_heads, 0, starts)]


def _conv_slots(backend: Any, layer: Any) -> int:
    """The slots of the layer's conv-state cache (the mamba pool's first dimension)."""
    return int(backend.req_to_token_pool.mamba2_layer_cache(layer.layer_id).conv[0].shape[0])


def _mark(layer: Any) -> None:
    """The layer, and the conv1d layer whose weights it holds (a view of them: its model never calls it)."""
    seen(layer)
    seen_weights(getattr(layer.conv_weights, "_base", None), layer.conv_weights)


def layer_calls(self: Any, forward_batch: Any, mixed_qkv: torch.Tensor) -> list[KernelCall]:
    """``RadixLinearAttention.forward``, eagerly: the step's conv1d and recurrence."""
    _mark(self)
    require(judged_once(self, layer_problem))
    return _calls(self, forward_batch, mixed_qkv.dtype)


def captured_layer_calls(self: Any, mixed_qkv: torch.Tensor) -> Callable[[], list[KernelCall]]:
    """While a CUDA graph captures the layer (or torch.compile traces a prefill): how to build its
    calls in each step that replays it, from that step's batch."""
    _mark(self)
    require(layer_problem(self))
    return functools.partial(_calls_in_graph, self, mixed_qkv.dtype)


def _calls_in_graph(layer: Any, dtype: torch.dtype) -> list[KernelCall]:
    batch = STEP.context.get("batch")
    if batch is None:
        raise RuntimeError("a CUDA graph replayed outside a model step: its Gated DeltaNet layout is unknown")
    return _calls(layer, batch, dtype)


def fused_norm_problem(layer: Any) -> Optional[str]:
    """Why SGLang's ``FusedRMSNormGated`` is not what ``gated_rmsnorm_*`` computes (no weight, a
    gate other than SiLU), or None. Its norm comes before its gate."""
    found = [what for what, applies in {
        "no weight (elementwise_affine=False)": not getattr(layer, "elementwise_affine", True),
        f"a {getattr(layer, 'activation', None)} gate": getattr(layer, "activation", None) not in ("silu", "swish"),
        "a bias": getattr(layer, "bias", None) is not None,
    }.items() if applies]
    return f"{type(layer).__name__} with {', '.join(found)} (no Definition computes it)" if found else None


def fused_norm_calls(self: Any, x: torch.Tensor, g: torch.Tensor, residual: Optional[torch.Tensor] = None,
                     prenorm: bool = False) -> list[KernelCall]:
    """``FusedRMSNormGated.forward``: RMSNorm of ``x``, times the weight, times SiLU of the gate."""
    seen(self)
    require(judged_once(self, fused_norm_problem)
            or ("FusedRMSNormGated with a residual (no Definition computes it)" if residual is not None else None))
    return [rmsnorm.gated_call(x, float(self.eps))]


def gated_norm_problem(layer: Any) -> Optional[str]:
    """FLA's gated ``RMSNorm`` (SGLang builds it where prefills run in piecewise graphs), judged as
    vLLM's ``RMSNormGated``: the gate after the norm, one group, no bias, a SiLU gate."""
    return rmsnorm.gated_attributes_problem(layer)


def gated_norm_calls(self: Any, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> list[KernelCall]:
    """FLA's gated ``RMSNorm.forward``: gated where a gate is given, else a plain RMSNorm."""
    seen(self)
    require(judged_once(self, gated_norm_problem))
    return [rmsnorm.gated_call(x, float(self.eps)) if z is not None else rmsnorm.call(x, None, float(self.eps))]
