"""vLLM entry points: the general plugin (every vLLM process) and the worker extension.

``register`` runs in every vLLM process through the ``vllm.general_plugins`` entry point, before
any model is built. It patches only when ``FI_PROFILE_CAPTURE=1`` (set by ``fi-profile``), so an
installed fi-profile costs nothing to other vLLM users. The driver then talks to the recorder in
each worker through :class:`CaptureWorkerExtension` (``worker_extension_cls``) with
``collective_rpc``: start the model phase, stop and flush.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from hooks.patching import install
from profiler.capture.recorder import RECORDER

ENV_ENABLE = "FI_PROFILE_CAPTURE"
STATUS: dict[str, list[str]] = {"installed": [], "missing": []}


def register() -> None:
    if os.environ.get(ENV_ENABLE) != "1" or STATUS["installed"]:
        return
    from hooks.vllm_adapter import POINTS

    STATUS["installed"], STATUS["missing"] = install(POINTS)


class CaptureWorkerExtension:
    """Mixed into vLLM's Worker; methods are called with ``llm.collective_rpc(name, args)``."""

    vllm_config: Any

    def fi_profile_start(
        self, count_only: bool = False, out_dir: Optional[str] = None, autosave_s: float = 10.0
    ) -> dict[str, Any]:
        """Start recording; with ``out_dir`` the part is also saved every ``autosave_s`` seconds."""
        cache = self.vllm_config.cache_config
        RECORDER.autosave = (Path(out_dir), autosave_s) if out_dir is not None else None
        RECORDER.reset()
        RECORDER.count_only = count_only
        RECORDER.page_size = int(cache.block_size)
        RECORDER.num_pages = int(getattr(cache, "num_gpu_blocks", None) or 0)
        RECORDER.active = True
        return {"pid": os.getpid(), **STATUS}

    def fi_profile_stop(self, out_dir: str) -> str:
        RECORDER.active = False
        RECORDER.autosave = None
        return str(RECORDER.flush(Path(out_dir)))
