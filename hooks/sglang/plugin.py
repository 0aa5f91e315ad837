"""SGLang entry point: the ``sglang.srt.plugins`` plugin (loaded in the main, scheduler and
detokenizer processes; the model runs in the scheduler).

``register`` patches only when ``FI_PROFILE_CAPTURE=1`` and adds two methods to the Scheduler that
the driver calls with ``Engine.collective_rpc``: start the model phase, stop and save the part.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

ENV_ENABLE = "FI_PROFILE_CAPTURE"
STATUS: dict[str, list[str]] = {"installed": [], "missing": []}


def fi_profile_start(self: Any, count_only: bool = False, out_dir: Optional[str] = None, autosave_s: float = 10.0) -> None:
    from fi_profile.capture.dummy_routing import ZEROED
    from fi_profile.capture.recorder import start_recording

    start_recording(count_only=count_only, out_dir=out_dir, autosave_s=autosave_s, page_size=1,
                    num_pages=int(getattr(self, "max_total_num_tokens", 0) or 0))
    if out_dir is not None:  # what was installed, for the driver (collective_rpc returns no value)
        status = Path(out_dir) / ".fi-profile" / f"hooks-{os.getpid()}.txt"
        status.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"missing {m}" for m in STATUS["missing"]]
        lines += [f"not_covered {count} {kind}" for kind, count in _not_covered(self).items()]
        lines.append(f"dummy_biases_zeroed {len(ZEROED)}")
        status.write_text("\n".join(lines))


def _not_covered(scheduler: Any) -> dict[str, int]:
    from fi_profile.capture.layers import uncovered_layers
    from fi_profile.hooks.sglang.hook_points import KERNEL_LAYERS, LAYER_RULES

    try:
        return uncovered_layers(scheduler.tp_worker.model_runner.model, LAYER_RULES, KERNEL_LAYERS)
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        return {f"model not inspected ({type(exc).__name__}: {exc})"[:200].replace("\n", " "): 0}


def fi_profile_stop(self: Any, out_dir: str) -> None:
    from fi_profile.capture.layers import unseen_layers
    from fi_profile.capture.recorder import RECORDER, stop_recording
    from fi_profile.families import KERNEL_NAMING
    from fi_profile.hooks.sglang.hook_points import LAYER_RULES

    unseen: dict[str, int] = {}
    if RECORDER.engine_steps:
        try:
            unseen = unseen_layers(self.tp_worker.model_runner.model, LAYER_RULES)
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            unseen = {f"model not inspected for layers never seen ({type(exc).__name__}: {exc})"[:200]: 0}
    stop_recording(out_dir, unseen, KERNEL_NAMING)


def fi_profile_save(self: Any, out_dir: str) -> None:
    """A signal stopped the capture: stop recording and save this scheduler's whole steps."""
    from fi_profile.capture.recorder import save_whole_steps

    save_whole_steps(out_dir)


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """The scheduler process's entry with the hooks registered first: for SGLang versions whose
    scheduler does not load ``sglang.srt.plugins`` (the runner passes it as the Engine's
    ``run_scheduler_process_func``; where plugins load, ``register`` has nothing left to do)."""
    from sglang.srt.managers.scheduler import run_scheduler_process as original

    register()
    return original(*args, **kwargs)


def register() -> None:
    if os.environ.get("FI_PROFILE_DRIVER_PID"):  # an engine process fi-profile started: dies with it
        from fi_profile.capture.parent_watch import die_with_parent

        die_with_parent()
    if os.environ.get(ENV_ENABLE) != "1" or STATUS["installed"]:
        return
    from fi_profile.capture.patching import install
    from fi_profile.hooks.sglang.hook_points import POINTS

    STATUS["installed"], STATUS["missing"] = install(POINTS)
    try:
        from sglang.srt.managers.scheduler import Scheduler
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        STATUS["missing"].append(f"sglang.srt.managers.scheduler.Scheduler ({type(exc).__name__}: {exc})"[:300])
        return
    Scheduler.fi_profile_start = fi_profile_start  # type: ignore[attr-defined]
    Scheduler.fi_profile_stop = fi_profile_stop  # type: ignore[attr-defined]
    Scheduler.fi_profile_save = fi_profile_save  # type: ignore[attr-defined]
