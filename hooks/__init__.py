"""Engine adapters: monkeypatch hooks that reach every vLLM / SGLang engine process.

The vLLM adapter, the SGLang adapter and the op table they share arrive with the capture work.
"""
