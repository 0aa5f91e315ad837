"""A compiled forward or a captured CUDA graph ran: its templates become the step's calls.

No Python hook runs inside compiled code or a replayed CUDA graph, so the engine integration
reports each run (with the sizes it ran at) and the templates recorded while the forward was
traced (:mod:`fi_profile.capture.traced`) or the graph captured (:mod:`fi_profile.capture.graph_capture`)
are counted as that step's hooked invocations.
"""

from __future__ import annotations

import functools
from typing import Mapping

from fi_profile.capture.kernel_accounting import ACCOUNTING, JOIN, GraphCalls
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
    live_labels: list[str] = []  # this step's Definitions of each live group, for the accounting
    if replay is not None and RECORDER.count_only:  # a step like one learned, live groups and all: counted in
        # one go; the learned step holds each group's labels in the groups' order (as learned, below)
        live_labels = replay.count_at(len(trace.templates), trace.live_offsets())
    elif replay is not None:  # a step like one learned but for its live groups, recorded each step
        replay.count("", trace.fixed)
        for op, live, layers in trace.live_groups():
            try:
                live_labels.append(RECORDER.record(live(), op, learned=False, where=where, times=layers))
            except Exception as exc:  # noqa: BLE001 - a hook must never break the engine
                live_labels.append(RECORDER.lost(op, exc, learned=False, times=layers))
    else:
        for op, template, layers in trace.groups():  # a step being learned: layers of one shape at once
            label = observe(op, functools.partial(_realize, template, sizes), live=template.live is not None,
                            where=where, times=layers)
            if template.live is not None:
                live_labels.append(label)
    if ACCOUNTING.active:  # the run that follows is this graph's: its kernels are its calls'
        ACCOUNTING.pending_graph = graph_calls(trace, tuple(live_labels))


def graph_calls(trace: Trace, live_labels: tuple[str, ...]) -> int:
    """The accounting's index of ``trace``'s calls in order (live ones with this step's labels)."""

    def calls() -> GraphCalls:
        by_live = dict(zip((_live_key(live) for _, live, _ in trace.live_groups()), live_labels))
        found = []
        unowned: list[str] = []  # why the nodes cannot give the kernels to the calls
        named = []
        for template in trace.templates:
            if template.live is not None:
                label = by_live.get(_live_key(template.live), "")
                names = tuple(label.split(JOIN)) if label else ()
            elif template.prologue:  # its kernels are the Definitions' it prepares
                names = template.prologue
            else:
                names = tuple(dict.fromkeys(c.definition.name for c in template.calls))
            named.append(names)
        first_found: list[int] = []  # per template: the index in ``found`` of its call, or of the next call
        for at, (template, names) in enumerate(zip(trace.templates, named)):
            first_found.append(len(found))
            prologue = bool(template.prologue)
            if not names and template.feeds and template.error is None:  # its kernels are the next such call's
                names = next((later for t, later in zip(trace.templates[at + 1:], named[at + 1:])
                              if t.op == template.feeds), ())
                prologue = bool(names)
            # an invocation that records nothing of its own (another hook records its kernels: an
            # FP8 layer's GEMM under vLLM's fused q/kv-a op) is no call here, as it opens no range
            # in eager steps; one that failed is (its kernels are nobody's)
            if names or template.error is not None:
                found.append((template.op, names, template.nodes, prologue))
                if template.nodes is None:
                    unowned.append(f"{template.op}: its nodes were not read")
            elif template.nodes is None or template.nodes[1] > template.nodes[0]:
                # its kernels another call records: no node order gives them to it
                launched = "" if template.nodes is None else f" {template.nodes[1] - template.nodes[0]}"
                unowned.append(f"{template.op}: records nothing but launched{launched} nodes")
        first_found.append(len(found))
        nodes = tuple(n for _, _, n, _ in found)
        return GraphCalls(tuple((op, names) for op, names, _, _ in found),
                          None if unowned or not found else nodes,  # type: ignore[arg-type]
                          frozenset(i for i, c in enumerate(found) if c[3]),
                          tuple(dict.fromkeys(unowned)), _spans(trace.templates, first_found),
                          {first_found[at]: t.tail for at, t in enumerate(trace.templates)
                           if t.tail and first_found[at + 1] > first_found[at]})

    return ACCOUNTING.graph_index((id(trace), len(trace.templates), live_labels), calls)


def _spans(templates: list[Template], first_found: list[int]) -> dict[int, tuple[int, int]]:
    """The calls of hooked methods around their inner calls (:attr:`Template.span`): call index ->
    its inner calls' [first, end), itself among them, as calls of the graph."""
    spans = {}
    for at, template in enumerate(templates):
        if template.span is not None and first_found[at + 1] > first_found[at]:  # it is a call
            before, after = template.span
            inner = (first_found[at - before], first_found[at + 1 + after])
            if inner != (first_found[at], first_found[at] + 1):  # its inner calls are calls
                spans[first_found[at]] = inner
    return spans


def _live_key(live: object) -> object:
    """What makes live templates one group (:func:`fi_profile.capture.traced._same_calls`)."""
    return getattr(live, "func", live), getattr(live, "args", ())


def _realize(template: Template, sizes: Mapping[str, int]) -> list[KernelCall]:
    if template.error is not None:
        raise RuntimeError(template.error)
    return template.realize(sizes)
