"""vLLM entry points: the general plugin (every vLLM process) and the worker extension.

``register`` runs in every vLLM process through the ``vllm.general_plugins`` entry point, before
any model is built. It patches only when ``FI_PROFILE_CAPTURE=1`` (set by ``fi-profile``), so an
installed fi-profile costs other vLLM users nothing: this module imports only ``os`` and
``typing`` until capture is on (``benchmarks/plugin_import_cost.py`` measures it). The driver then talks to the recorder in
each worker through :class:`CaptureWorkerExtension` (``worker_extension_cls``) with
``collective_rpc``: start the model phase, stop and flush.
"""

from __future__ import annotations

import os
from typing import Any, Optional

ENV_ENABLE = "FI_PROFILE_CAPTURE"
STATUS: dict[str, list[str]] = {"installed": [], "missing": []}


def register() -> None:
    if os.environ.get(ENV_ENABLE) != "1" or STATUS["installed"]:
        return
    from fi_profile.hooks.patching import install
    from fi_profile.hooks.vllm.adapter import POINTS

    STATUS["installed"], STATUS["missing"] = install(POINTS)


def _not_covered(worker: Any) -> dict[str, int]:
    from fi_profile.hooks.layer_calls import uncovered_layers

    try:
        return uncovered_layers(worker.model_runner.get_model())
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        return {f"model not inspected ({type(exc).__name__}: {exc})"[:200]: 0}


class CaptureWorkerExtension:
    """Mixed into vLLM's Worker; methods are called with ``llm.collective_rpc(name, args)``."""

    vllm_config: Any

    def fi_profile_start(
        self, count_only: bool = False, out_dir: Optional[str] = None, autosave_s: float = 10.0
    ) -> dict[str, Any]:
        """Start recording; with ``out_dir`` the part is also saved every ``autosave_s`` seconds."""
        from fi_profile.capture.recorder import start_recording

        cache = self.vllm_config.cache_config
        start_recording(count_only=count_only, out_dir=out_dir, autosave_s=autosave_s, page_size=int(cache.block_size),
                        num_pages=int(getattr(cache, "num_gpu_blocks", None) or 0))
        return {"pid": os.getpid(), **STATUS, "not_covered": _not_covered(self)}

    def fi_profile_stop(self, out_dir: str) -> str:
        from fi_profile.capture.recorder import RECORDER, stop_recording
        from fi_profile.hooks.traced import TRACES

        stepped = sum(RECORDER.step_stats.values()) or RECORDER.step_tokens
        if any(t.templates for t in TRACES.values()) and not RECORDER.graph_runs and stepped:
            # every step of a compiled model runs its compiled forward: none seen means this vLLM
            # runs it where no hook point is, and its calls are missing
            RECORDER.error("compiled_forward", RuntimeError(
                "the model's forward was traced by torch.compile, but no run of the compiled forward was seen: "
                "its calls are not in the record (this vLLM version runs it past fi-profile's hook points)"))
        return str(stop_recording(out_dir))
