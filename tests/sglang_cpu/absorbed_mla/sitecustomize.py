"""Test-only scaffolding (on ``PYTHONPATH`` in every SGLang process of a test that asks for it):
SGLang's DeepSeek attention runs MLA in its absorbed form in every step.

SGLang 0.5.23's CPU attention backend (``torch_native``) cannot run DeepSeek's default prefill
(up-projected q/k of 192 against its own ragged k/v: the backend reads keys from the 576-wide
latent cache instead), and SGLang's dispatch has no entry for it (it falls back to the ``triton``
backend's rule: up-projected prefill when nothing is cached). This registers ``torch_native``'s
rule as SGLang's own absorbed-MLA choice (``_dispatch_mla_subtype``, what its ``triton`` rule
returns for decode, cached prefixes, deterministic inference and piecewise CUDA graphs), so the
engine's own absorbed path runs in prefill too. Nothing else of the engine is changed.
"""

import importlib.abc
import importlib.util
import sys

_HANDLER = "sglang.srt.models.deepseek_common.attention_backend_handler"


def _register(module):
    module.AttentionBackendRegistry.register("torch_native", module._dispatch_mla_subtype)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name != _HANDLER:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register(module)


sys.meta_path.insert(0, _AfterImport())
