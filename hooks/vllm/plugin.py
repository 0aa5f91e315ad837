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
    if os.environ.get("FI_PROFILE_DRIVER_PID"):  # an engine process fi-profile started: dies with it
        from fi_profile.capture.parent_watch import die_with_parent

        die_with_parent()
    if os.environ.get(ENV_ENABLE) != "1" or STATUS["installed"]:
        return
    from fi_profile.capture.patching import install
    from fi_profile.hooks.vllm.hook_points import POINTS

    STATUS["installed"], STATUS["missing"] = install(POINTS)


def _not_covered(worker: Any) -> dict[str, int]:
    from fi_profile.capture.layers import uncovered_layers
    from fi_profile.hooks.vllm.hook_points import KERNEL_LAYERS, LAYER_RULES

    try:
        return uncovered_layers(worker.model_runner.get_model(), LAYER_RULES, KERNEL_LAYERS)
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        return {f"model not inspected ({type(exc).__name__}: {exc})"[:200]: 0}


def _unseen(model: Any) -> dict[str, int]:
    from fi_profile.capture.layers import unseen_layers
    from fi_profile.hooks.vllm.hook_points import LAYER_RULES

    try:
        return unseen_layers(model, LAYER_RULES)
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        return {f"model not inspected for layers never seen ({type(exc).__name__}: {exc})"[:200]: 0}


def rewritten_layers(vllm_config: Any, model: Any) -> dict[str, int]:
    """The layers whose kernels vLLM's compile passes run otherwise than the traced forward the hooks
    record (it is recorded as traced: said, never silent), by what ran:

    - sequence parallelism (``pass_config.enable_sp``, vLLM's default at -O2 for TP > 1 where the
      model is large enough: hidden size >= 8192 on Hopper and Blackwell): each all-reduce + RMSNorm
      of a compiled forward of at least ``sp_min_token_num`` tokens becomes reduce-scatter + RMSNorm
      on 1/TP of the tokens + all-gather; with async TP on as well (``fuse_gemm_comms``) the GEMMs
      beside those collectives are fused with them and run in pieces over the token shards;
    - the all-reduce + RMSNorm fusion (``pass_config.fuse_allreduce_rms``, vLLM's default for TP > 1
      on Hopper and Blackwell where FlashInfer is installed): each all-reduce and the RMSNorm after
      it run as one FlashInfer kernel in compiled forwards up to its size limit."""
    tp = int(getattr(vllm_config.parallel_config, "tensor_parallel_size", 1) or 1)
    compilation = vllm_config.compilation_config
    passes = getattr(compilation, "pass_config", None)
    # vLLM's own passes run (before 0.11 the mode was ``level`` 3; the passes had longer names)
    compiled = getattr(getattr(compilation, "mode", None), "name", None) == "VLLM_COMPILE" or (
        getattr(compilation, "level", None) == 3)
    if tp == 1 or not compiled:
        return {}
    sp = getattr(passes, "enable_sp", None) or getattr(passes, "enable_sequence_parallelism", False)
    async_tp = getattr(passes, "fuse_gemm_comms", None) or getattr(passes, "enable_async_tp", False)
    fused_norms = getattr(passes, "fuse_allreduce_rms", None) or getattr(passes, "enable_fi_allreduce_fusion", False)
    names = [type(module).__name__ for module in model.modules()]
    #: the all-reduce after each row-parallel layer and the embedding, before the norm it feeds
    all_reduces = sum(1 for name in names if name in ("RowParallelLinear", "VocabParallelEmbedding"))
    found = {}
    if sp:
        threshold = getattr(passes, "sp_min_token_num", None)
        steps = f"compiled steps of at least {threshold} tokens" if threshold is not None else "large compiled steps"
        exactly = ("--eager, or --engine-arg 'compilation_config={\"pass_config\": {\"enable_sp\": false, "
                   "\"fuse_gemm_comms\": false}}', records exactly")
        found[f"RMSNorm under vLLM's sequence parallelism ({steps} ran it on 1/{tp} of the tokens; recorded at the "
              f"full count; {exactly})"] = names.count("RMSNorm")
        found[f"all-reduce under vLLM's sequence parallelism ({steps} ran it as a reduce-scatter and an all-gather; "
              f"recorded as one all-reduce; {exactly})"] = all_reduces
        if async_tp:
            found[f"linear layer under vLLM's async TP ({steps} ran its GEMM fused with an all-gather or "
                  f"reduce-scatter, in pieces over the token shards; recorded as one GEMM; {exactly})"] = sum(
                1 for name in names if name.endswith("ParallelLinear"))
    if fused_norms:
        found["all-reduce under vLLM's all-reduce + RMSNorm fusion (compiled steps up to its size limit ran it and the "
              "RMSNorm after it as one FlashInfer kernel; recorded as an all-reduce and an RMSNorm; --eager, or "
              "--engine-arg 'compilation_config={\"pass_config\": {\"fuse_allreduce_rms\": false}}', records "
              "exactly)"] = all_reduces
    return {kind: layers for kind, layers in found.items() if layers}


def _inexact(worker: Any) -> dict[str, int]:
    try:
        return rewritten_layers(worker.vllm_config, worker.model_runner.get_model())
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        return {f"compile passes not inspected ({type(exc).__name__}: {exc})"[:200]: 0}


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
        from fi_profile.capture.dummy_routing import ZEROED

        return {"pid": os.getpid(), **STATUS, "not_covered": _not_covered(self), "inexact": _inexact(self),
                "dummy_biases_zeroed": len(ZEROED)}

    def fi_profile_save(self, out_dir: str) -> Optional[str]:
        """A signal stopped the capture: stop recording and save this worker's whole steps."""
        from fi_profile.capture.recorder import save_whole_steps

        return save_whole_steps(out_dir)

    def fi_profile_stop(self, out_dir: str) -> str:
        from fi_profile.capture.recorder import RECORDER, stop_recording
        from fi_profile.capture.traced import TRACES
        from fi_profile.families import KERNEL_NAMING

        stepped = sum(RECORDER.step_stats.values()) or RECORDER.step_tokens
        if any(t.templates for t in TRACES.values()) and not RECORDER.graph_runs and stepped:
            # every step of a compiled model runs its compiled forward: none seen means this vLLM
            # runs it where no hook point is, and its calls are missing
            RECORDER.error("compiled_forward", RuntimeError(
                "the model's forward was traced by torch.compile, but no run of the compiled forward was seen: "
                "its calls are not in the record (this vLLM version runs it past fi-profile's hook points)"))
        unseen = _unseen(self.model_runner.get_model()) if RECORDER.engine_steps else {}
        return str(stop_recording(out_dir, unseen, KERNEL_NAMING))
