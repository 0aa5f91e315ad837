"""Engine integration, one folder per engine (``vllm/``, ``sglang/``): its plugin entry point, its
runner, and its hook points per op family with what reads its own layers. The engine-independent
machinery (wrapping, arguments by name, layer judging, graph mode) is the capture core's
(``fi_profile.capture``), each op family's calls are ``fi_profile.families``'; dependencies point
from here to those, never back.

Kept import-free: the engines import the plugin modules in every process.
"""
