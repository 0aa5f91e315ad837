"""Token embedding: rows of a ``[vocab, hidden]`` table gathered for the token ids. Op type
``embedding``; hooked on the engines' ``VocabParallelEmbedding``."""

from __future__ import annotations

from typing import Any

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition, dtype_suffix
from fi_profile.capture.layers import seen
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, Family
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import schema_dtype

KEY = "embedding"


def call(ids: torch.Tensor, vocab: int, hidden: int, dtype: torch.dtype) -> KernelCall:
    """Rows of a ``[vocab, hidden]`` table of ``dtype`` gathered for ``ids`` (logical sizes)."""

    def build() -> Definition:
        schema = schema_dtype(dtype)
        return definition_for("embedding_v128256_h4096", f"embedding_v{vocab}_h{hidden}{dtype_suffix(schema)}",
                              {"vocab_size": vocab, "hidden_size": hidden}, schema)

    definition = cached_definition(("embedding", vocab, hidden, dtype), build)
    return KernelCall(definition, {"num_tokens": ids.numel()})


def layer_calls(self: Any, input_: torch.Tensor) -> list:
    """``VocabParallelEmbedding.forward`` (vLLM and SGLang alike)."""
    seen(self)
    dtype = self.weight.dtype  # an emptied or repacked table keeps its dtype; a quantized one would not
    if not dtype.is_floating_point:
        raise NotImplementedError(f"{type(self).__name__}: {dtype} embedding table (quantized): no Definition")
    return [call(input_, int(self.num_embeddings_per_partition), int(self.embedding_dim), dtype)]


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("embedding",),
    templates=("embedding_v128256_h4096",),
    baselines=(Baseline("torch_embedding.py"),),
    engine_kernel=engine_kernels.torch_call,
    kernel_words=("embedding", "indexselect"),  # Inductor names a gather of RoPE's cos/sin cache index_select
)
