"""Routing with dummy weights as a trained model's spreads it: a MoE model's biases zeroed.

An engine's dummy weights are uniform within ±1e-3. A MoE router's scores are then about
√hidden · 1e-6 (activations scaled by norm weights within ±1e-3, times router weights within ±1e-3),
while its bias (gpt-oss's router GEMM's, DeepSeek's and GLM's score correction) is up to 1e-3: the
bias alone picks the experts, the same ones for every token. The biases the layers add to the hidden
states (attention projections', experts' outputs') do the same one step removed: they are as large as
a token's embedding and the same for every token, so every token's router input is alike. The
engine then reads a few experts' weights a step where a trained model reads most of them, and its
MoE kernel time is no model's (a projection against it was off × 1.9-2.7: BENCHMARKS.md).

So in a model with MoE layers every bias is zeroed: each token's hidden state is then its own
embedding's work, and its router scores pick its experts (``benchmarks/dummy_routing_spread.py``
measures the spread). No kernel's time depends on a bias's values but the routing's. Done once, when
the engine's dummy loader has drawn the weights and before the engine turns them into its kernels'
layout (a CPU backend repacks linear layers then). A capture that did it says how many in
``run.dummy_biases_zeroed``; ``FI_PROFILE_DUMMY_ROUTING=engine`` keeps the engine's draw.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Callable, Iterator

import torch

#: ``engine``: leave the dummy weights as the engine drew them
ENV_ROUTING = "FI_PROFILE_DUMMY_ROUTING"
#: the biases zeroed in this process (their names), reported when recording starts
ZEROED: list[str] = []


def dummy_biases(model: torch.nn.Module, is_moe: Callable[[Any], bool]) -> dict[str, torch.Tensor]:
    """The biases to zero in ``model``, by name: none in a model without a MoE layer (``is_moe``
    tells one); else every floating-point parameter or buffer whose name ends in ``bias`` (a
    router's, a correction bias, the projections' and the experts' own)."""
    if not any(is_moe(module) for module in model.modules()):
        return {}
    return {name: tensor for name, tensor in [*model.named_parameters(), *model.named_buffers()]
            if name.rsplit(".", 1)[-1].endswith("bias") and tensor.is_floating_point()}


def zero_dummy_biases(model: torch.nn.Module, is_moe: Callable[[Any], bool]) -> list[str]:
    """Zero :func:`dummy_biases` in place; their names, also kept in :data:`ZEROED`."""
    found = dummy_biases(model, is_moe)
    with torch.no_grad():
        for tensor in found.values():
            tensor.zero_()
    ZEROED.extend(found)
    return list(found)


def after_dummy_weights(is_moe: Callable[[Any], bool]) -> Callable[..., Any]:
    """An ``around`` hook for the engine's function that draws dummy weights into ``model``: when it
    returns, :func:`zero_dummy_biases` (unless ``FI_PROFILE_DUMMY_ROUTING=engine``). A failure never
    stops the engine: it is warned of, and the record then has no ``run.dummy_biases_zeroed`` (the
    replay flags a bias-routed MoE row as for the engine's draw)."""

    @contextlib.contextmanager
    def around(model: torch.nn.Module) -> Iterator[None]:
        yield
        if os.environ.get(ENV_ROUTING) == "engine":
            return
        try:
            zero_dummy_biases(model, is_moe)
        except Exception as exc:  # noqa: BLE001 - a hook must never break the engine
            warnings.warn(f"fi-profile: the MoE model's dummy biases were not zeroed ({type(exc).__name__}: {exc}); "
                          "its routing is the engine's draw", RuntimeWarning, stacklevel=2)

    return around
