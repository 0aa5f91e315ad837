"""vLLM's MoE layers (``MoERunner``) as the MoE family's calls: what its router and experts say
they do, read into :func:`fi_profile.families.moe.problems`, and the router GEMM that runs where
no linear hook sees it."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.layers import seen
from fi_profile.families import gemm, moe

#: routers whose selection is softmax -> top-k (-> renormalize), as the MoE Definitions compute it
SOFTMAX_TOPK_ROUTERS = ("FusedTopKRouter", "CPURouter")


def _opaque(runner: Any) -> Optional[bool]:
    """Whether the runner's experts run inside vLLM's opaque ``moe_forward`` custom op (its GPU
    path): what runs in there is never traced, so no CUDA graph step shows it to a hook. None: this
    vLLM's runner does not say (no ``_forward_entry``)."""
    entry = getattr(runner, "_forward_entry", None)
    return None if entry is None else type(entry).__name__.startswith("OpOverload")


def problems(runner: Any) -> list[str]:
    """What a MoE layer (``MoERunner``) has that no MoE Definition computes."""
    router, config, experts = runner.router, runner.moe_config, runner.routed_experts
    activation = getattr(getattr(experts, "activation", None), "value", getattr(experts, "activation", "silu"))
    found = moe.problems(
        router=None if type(router).__name__ in SOFTMAX_TOPK_ROUTERS else type(router).__name__,
        scoring=getattr(router, "scoring_func", None),
        grouped_topk=bool(getattr(router, "use_grouped_topk", False)),
        routed_scaling=float(getattr(runner, "routed_scaling_factor", 1.0) or 1.0),
        quantization=type(experts.quant_method).__name__,
        activation=str(activation), gated=bool(getattr(config, "is_act_and_mul", True)),
        expert_bias=bool(getattr(config, "has_bias", False)),
        expert_parallel=config.num_local_experts != router.global_num_experts,
    )
    opaque = _opaque(runner)
    if getattr(runner, "_shared_experts", None) is not None and opaque:
        found.append("shared experts inside vLLM's opaque moe_forward_shared op (not seen in CUDA-graph steps)")
    if opaque is None and getattr(runner, "gate", None) is not None:
        found.append("a router applied where fi-profile cannot tell whether graph steps show it (no MoERunner._forward_entry)")
    return found


def layer_problem(runner: Any) -> Optional[str]:
    return moe.layer_problem(runner, problems(runner))


def layer_calls(self: Any, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> list:
    """``MoERunner.forward``: routing and experts as one fused MoE call. A runner that holds its
    router (``gate``) applies it inside the opaque custom op on GPUs, where graph steps never show
    it to the linear hook: its GEMM is recorded here then (and always where vLLM fuses it with the
    shared-expert gate into one F.linear), and the gate layer's own hook leaves it to this one."""
    router, config = self.router, self.moe_config
    seen(self)
    calls = moe.layer_calls(hidden_states, router_logits, problems(self), num_experts=config.num_local_experts,
                            top_k=router.top_k, intermediate_size=config.intermediate_size_per_partition,
                            renormalize=bool(router.renormalize))
    gate, fused = getattr(self, "gate", None), bool(getattr(self, "_fse_fuse_gate", False))
    if gate is None or not (_opaque(self) or fused):  # the gate's own hook sees it (traced or eager)
        return calls
    n, k = gemm.layer_size(gate)
    layers = [gate]
    if fused:  # one F.linear over the router and shared-expert gate weights, hooked nowhere else
        n += gemm.layer_size(self.shared_expert_gate)[0]
        layers.append(self.shared_expert_gate)
    gate._fi_profile_recorded_by = "moe"
    seen(*layers)
    bias = any(getattr(layer, "bias", None) is not None for layer in layers)
    return [gemm.call(hidden_states, n, k, bias=bias), *calls]
