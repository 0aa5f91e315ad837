"""A compiled forward or a captured CUDA graph ran: its templates become the step's calls.

No Python hook runs inside compiled code or a replayed CUDA graph, so the engine integration
reports each run (with the sizes it ran at) and the templates recorded while the forward was
traced (:mod:`fi_profile.capture.traced`) or the graph captured (:mod:`fi_profile.capture.graph_capture`)
are counted as that step's hooked invocations.
"""

from __future__ import annotations

import functools
from typing import Mapping

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.patching import observe
from fi_profile.capture.recorder import RECORDER
from fi_profile.capture.traced import Template, Trace


def count_graph_run(trace: Trace, sizes: Mapping[str, int], mode: str, ran_with: int) -> None:
    """One run of ``trace``'s forward or graph in this step, at ``sizes`` (its size symbols'
    values), as ``mode`` (compiled, piecewise_cuda_graph, full_cuda_graph) with ``ran_with``
    tokens (the padded count, for a CUDA graph)."""
    RECORDER.forward_seen = True
    RECORDER.graph_run(mode, ran_with, RECORDER.step_tokens)  # beside the step's scheduled tokens
    where = trace.where
    replay = RECORDER.replay
    if replay is not None:  # a step like one learned: its calls counted in one go
        replay.count("", trace.fixed)
        for op, live, layers in trace.live_groups():
            if RECORDER.count_only:
                replay.count(op, layers)
            else:
                try:
                    RECORDER.record(live(), op, learned=False, where=where, times=layers)
                except Exception as exc:  # noqa: BLE001 - a hook must never break the engine
                    RECORDER.lost(op, exc, learned=False, times=layers)
        return
    for op, template, layers in trace.groups():  # a step being learned: layers of one shape at once
        observe(op, functools.partial(_realize, template, sizes), live=template.live is not None, where=where, times=layers)


def _realize(template: Template, sizes: Mapping[str, int]) -> list[KernelCall]:
    if template.error is not None:
        raise RuntimeError(template.error)
    return template.realize(sizes)
