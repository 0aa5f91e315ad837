"""SGLang's MoE layers as the MoE family's calls: ``TopK`` routes (it holds the router's
configuration) and ``FusedMoE`` right after it runs the experts; the two are one MoE call."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fi_profile.capture.layers import seen
from fi_profile.families import moe
from fi_profile.hooks.sglang.attention import STEP


def routing_problems(config: Any, runner: Any = None) -> dict[str, Any]:
    """What a ``TopK`` router (its ``topk_config``) does, as :func:`fi_profile.families.moe.problems`
    takes it."""
    return dict(
        scoring=getattr(config, "scoring_func", "softmax"),
        grouped_topk=bool(getattr(config, "use_grouped_topk", False)),
        custom_routing=getattr(config, "custom_routing_function", None) is not None,
        correction_bias=getattr(config, "correction_bias", None) is not None,
        fused_shared_experts=bool(getattr(config, "num_fused_shared_experts", 0)),
        routed_scaling=getattr(config, "routed_scaling_factor", None) or getattr(runner, "routed_scaling_factor", None),
    )


def routing_problem(router: Any) -> Optional[str]:
    return moe.layer_problem(router, moe.problems(**routing_problems(router.topk_config)))


def routing_calls(self: Any, router_logits: torch.Tensor) -> list:
    """``TopK``: no kernel of its own here; the routing it does is part of the MoE call that the
    experts layer right after it records (one fused MoE call, as for vLLM)."""
    seen(self)
    STEP.context["moe_routing"] = (router_logits, self.topk_config)
    return []


def layer_calls(self: Any, hidden_states: torch.Tensor) -> list:
    """``FusedMoE``: routing (from the ``TopK`` call before it) and SwiGLU experts as one call."""
    routing = STEP.context.pop("moe_routing", None)
    if routing is None:
        raise RuntimeError("MoE experts called without a TopK call before them: routing unknown")
    router_logits, config = routing
    runner = self.moe_runner_config
    found = moe.problems(
        **routing_problems(config, runner),
        quantization=type(self.quant_method).__name__,
        activation=runner.activation, gated=bool(getattr(runner, "is_gated", True)),
        router_weight_on_input=bool(getattr(runner, "apply_router_weight_on_input", False)),
        expert_parallel=self.num_local_experts != self.num_experts,
    )
    return moe.layer_calls(hidden_states, router_logits, found, num_experts=self.num_experts, top_k=config.top_k,
                           intermediate_size=self.intermediate_size_per_partition, renormalize=bool(config.renormalize))
