"""Engine integration, one folder per engine (``vllm/``, ``sglang/``: plugin entry point, adapter,
runner), on the engine-independent pieces here: ``patching`` (wrapping a method), ``arguments``
(reading its arguments by name), ``layer_calls`` (layers the engines share in shape). Dependencies
point one way: from here to the capture core (``fi_profile.capture``), never back.

Kept import-free: the engines import the plugin modules in every process.
"""
