"""Top-k and/or top-p sampling from a distribution over the vocabulary. Op type ``sampling``;
hooked on the engines' samplers (outside the model's forward)."""

from __future__ import annotations

from typing import Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall
from fi_profile.families.family import Baseline, Family, Native
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


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    return [Native("flashinfer", "flashinfer_sampling.py", must_fit=True)]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("sampling",),
    templates=tuple(f"{kind}_sampling_from_probs_v128256" for kind in KINDS),
    baselines=(Baseline("torch_sampling.py"),),
    natives=_natives,
    check="distribution",
)
