"""SGLang integration: the plugin entry point, the runner, and SGLang's hook points per op family
(``hook_points.py``), with what reads its attention and MoE layers (``attention.py``, ``moe.py``)
and its model steps and CUDA graphs (``steps.py``)."""
