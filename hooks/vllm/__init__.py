"""vLLM integration: the plugin entry point, the runner, and vLLM's hook points per op family
(``hook_points.py``), with what reads its attention and MoE layers (``attention.py``, ``moe.py``)
and its engine steps and graph runs (``steps.py``)."""
