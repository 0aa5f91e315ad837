"""Routing with dummy weights as a trained model's spreads it: the routers' biases zeroed.

An engine's dummy weights are uniform within ±1e-3. A MoE router's scores are then about
√hidden · 1e-6 (activations scaled by norm weights within ±1e-3, times router weights within ±1e-3),
while its bias (gpt-oss's router GEMM's, DeepSeek's and GLM's score correction) is up to 1e-3: the
bias alone picks the experts, the same ones for every token. The engine then reads a few experts'
weights a step where a trained model reads most of them, and its MoE kernel time is not a model's
(a projection against it was off × 1.9-2.7: BENCHMARKS.md). With the biases zeroed, the scores,
which differ from token to token, pick the experts.

Done once, when the engine's dummy loader has drawn the weights and before the engine turns them into
its kernels' layout (a CPU backend repacks linear layers then). A capture that did it says so in
``run.router_biases_zeroed``; ``FI_PROFILE_DUMMY_ROUTING=engine`` keeps the engine's draw.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Optional

import torch

#: ``engine``: leave the dummy weights as the engine drew them
ENV_ROUTING = "FI_PROFILE_DUMMY_ROUTING"
#: the routing biases zeroed in this process (their parameter names), reported when recording starts
ZEROED: list[str] = []


def routing_biases(model: torch.nn.Module, experts_of: Callable[[Any], Optional[set[int]]]) -> dict[str, torch.Tensor]:
    """The routing biases of ``model``'s MoE layers, by name: in the block that holds a MoE layer
    (its router beside it, or inside it: the block's own tensors, its children's, and the MoE layer's
    children's), each tensor named ``*bias`` with one value per expert.
    ``experts_of(module)``: the expert counts a MoE layer's router may score (logical, and with
    redundant or fused shared experts), or None for any other module. The experts' own biases (one
    row per expert) have more values than experts, and are left as drawn."""
    found: dict[str, torch.Tensor] = {}
    for block_name, block in model.named_modules():
        if not any(experts_of(child) for child in block.children()):
            continue
        counts = set().union(*(experts_of(child) or set() for child in block.children()))
        prefix = f"{block_name}." if block_name else ""
        owners = [("", block), *((f"{name}.", child) for name, child in block.named_children())]
        owners += [(f"{name}.{inner}.", grandchild) for name, child in block.named_children() if experts_of(child)
                   for inner, grandchild in child.named_children()]  # a router inside the MoE layer
        for owner_name, owner in owners:
            for name, tensor in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]:
                if (name.endswith("bias") and tensor.is_floating_point() and tensor.numel() in counts
                        and max(tensor.shape, default=0) == tensor.numel()
                        and all(tensor is not other for other in found.values())):
                    found[f"{prefix}{owner_name}{name}"] = tensor
    return found


def zero_routing_biases(model: torch.nn.Module, experts_of: Callable[[Any], Optional[set[int]]]) -> list[str]:
    """Zero :func:`routing_biases` in place; their names, also kept in :data:`ZEROED`."""
    found = routing_biases(model, experts_of)
    with torch.no_grad():
        for tensor in found.values():
            tensor.zero_()
    ZEROED.extend(found)
    return list(found)


def after_dummy_weights(experts_of: Callable[[Any], Optional[set[int]]]) -> Callable[..., Any]:
    """An ``around`` hook for the engine's function that draws dummy weights into ``model``: when it
    returns, the routing biases are zeroed."""

    @contextlib.contextmanager
    def around(model: torch.nn.Module) -> Iterator[None]:
        yield
        if os.environ.get(ENV_ROUTING) != "engine":
            zero_routing_biases(model, experts_of)

    return around
