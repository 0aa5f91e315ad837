"""Baseline Solutions for the shipped Definitions' op families: plain PyTorch (``torch``), the same
source under ``torch.compile`` (``torch_compile``, for families without Python loops over data),
and the kernels the engines really run
(vLLM's ``_C`` ops, FlashInfer) where those libraries import.

Each ``*.py`` here is the source of one family's Solution; the lines ``NAME = value`` at its top
are set from the Definition (its reference's constants or its const axes) when it is used.
"""
