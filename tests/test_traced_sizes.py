"""The sizes a compiled forward ran with, read from its real arguments by the symbols its trace
bound (``fi_profile.capture.traced.sizes_of_run``)."""

import torch

from fi_profile.capture.traced import Trace, sizes_of_run


def hf_forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
    """transformers' decoder forward, as vLLM's Transformers backend calls it: by keyword, ``[1, tokens]``."""


def wrapper_forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
    """vLLM's ``TransformersForCausalLM.forward``, which a whole-model CUDA graph wraps: ``[tokens]``."""


def test_a_keyword_inputs_symbol_reads_the_keyword_arguments_dimension():
    trace = Trace(0, {"s27": ("input_ids", 1)})
    ids = torch.zeros(1, 37, dtype=torch.long)
    assert sizes_of_run(trace, hf_forward, (None,), {"input_ids": ids, "position_ids": ids}) == {"s27": 37}


def test_an_argument_of_another_rank_is_passed_over_not_an_index_error():
    """The wrapper's ``input_ids`` is ``[tokens]`` where the traced forward's was ``[1, tokens]``: the
    symbol is left to the caller (the padded token count), not read from the wrong dimension."""
    trace = Trace(0, {"s27": ("input_ids", 1)})
    assert sizes_of_run(trace, wrapper_forward, (None, torch.zeros(37), torch.zeros(37)), {}) == {}
