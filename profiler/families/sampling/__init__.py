"""The sampler's kernel: top-k and/or top-p sampling from a distribution over the vocabulary, and
greedy sampling (argmax) for requests at temperature 0. Op type ``sampling``; hooked on the
engines' samplers (outside the model's forward)."""

from __future__ import annotations

from typing import Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall
from fi_profile.families.family import Baseline, EngineKernel, EngineRun, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType

KEY = "sampling"
KINDS = ("top_k", "top_p", "top_k_top_p")


def call(probs_or_logits: torch.Tensor, top_k: bool, top_p: bool) -> Optional[KernelCall]:
    """Whichever of top-k and top-p some request of the batch uses; None for plain sampling."""
    if not top_k and not top_p:
        return None
    vocab = probs_or_logits.shape[-1]
    kind = "top_k_top_p" if top_k and top_p else ("top_k" if top_k else "top_p")
    name = f"{kind}_sampling_from_probs_v{vocab}"
    definition = definition_for(f"{kind}_sampling_from_probs_v128256", name, {"vocab_size": vocab}, DType.float32)
    return KernelCall(definition, {"batch_size": probs_or_logits.shape[0]})


def greedy_call(logits: torch.Tensor) -> KernelCall:
    """Greedy sampling (argmax over the vocabulary) of each row of ``logits``."""
    vocab = logits.shape[-1]
    definition = definition_for("greedy_sampling_from_logits_v128256", f"greedy_sampling_from_logits_v{vocab}",
                                {"vocab_size": vocab}, DType.float32)
    return KernelCall(definition, {"batch_size": logits.shape[0]})


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    if "logits" in definition.inputs:  # greedy: argmax, which FlashInfer's samplers do not offer
        return []
    return [Native("flashinfer", "flashinfer_sampling.py", must_fit=True)]


def _engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    if "logits" in definition.inputs:
        if run.framework == "SGLang":
            return EngineKernel("torch", "torch.argmax, as SGLang's sampler calls it")
        return EngineKernel(None, f"{run.framework}'s greedy sampler (vLLM: greedy_argmax, or its Triton "
                                  "Gumbel kernel at temperature 0), which the replay has no solution of")
    if run.framework == "SGLang":
        return EngineKernel("flashinfer", "FlashInfer's sampling kernel, as SGLang's sampler calls it")
    return None


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("sampling",),
    templates=(*(f"{kind}_sampling_from_probs_v128256" for kind in KINDS), "greedy_sampling_from_logits_v128256"),
    baselines=(Baseline("torch_greedy_sampling.py"), Baseline("torch_sampling.py")),
    natives=_natives,
    check="distribution",
    engine_kernel=_engine_kernel,
    kernel_words=("argmax", "topk", "top_k", "top_p", "sampling", "sample", "softmax", "sort", "multinomial", "exponential"),
)
