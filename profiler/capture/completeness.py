"""Whether a record is complete, decided in one place over its ``run`` block: a record that says
it is complete is; otherwise ``run.incomplete`` says, in words, everything it misses."""

from __future__ import annotations

from typing import Optional

from fi_profile.schema.run_info import RunInfo


def gaps(run: RunInfo, died: Optional[str] = None) -> list[str]:
    """What the record misses: the engine died mid-run (``died``), hooks failed, hook points are
    missing from this engine version, layers no hook records, layers recorded at other shapes."""
    found = [died] if died else []
    if run.hook_errors:
        found.append(_hook_errors(run))
    if run.hooks_missing:  # this engine version lacks them: whatever they record is not in the record
        found.append(f"hook points not found (their calls are not in the record): {', '.join(run.hooks_missing)}")
    if run.not_covered:
        layers = ", ".join(f"{n} x {kind}" for kind, n in run.not_covered.items())
        found.append(f"layers whose kernels no hook records (not in the record): {layers}")
    if run.inexact:
        layers = ", ".join(f"{n} x {kind}" for kind, n in run.inexact.items())
        found.append(f"layers recorded at other shapes than their kernels ran: {layers}")
    kernels = run.engine_kernels
    if kernels is not None and kernels.required_share is not None and kernels.attributed_share < kernels.required_share:
        largest = ", ".join(f"{k.name} {100 * k.share:.1f}%" for k in kernels.unattributed[:5])
        found.append(f"only {100 * kernels.attributed_share:.1f}% of the engine's kernel time is attributed to "
                     f"Definitions (required: {100 * kernels.required_share:.0f}%); largest not attributed: {largest}")
    return found


def judged(run: RunInfo, died: Optional[str] = None) -> RunInfo:
    """``run`` with ``incomplete`` set from its :func:`gaps` (absent when there are none)."""
    found = gaps(run, died)
    return run.model_copy(update={"incomplete": "; ".join(found) if found else None})


def _hook_errors(run: RunInfo) -> str:
    """What hook errors cost the record: per op, the hooked invocations whose calls are unknown and
    the recorded Definitions of that op whose counts are therefore low (a Definition that every
    invocation failed to match is not in the record at all)."""
    lost, affected = run.calls_lost or {}, run.affected_definitions or {}
    parts = []
    for op, names in affected.items():
        which = f"counts of {', '.join(names)} are low" if names else "none of its calls is in the record"
        parts.append(f"{lost[op]} {op} call(s) not recorded ({which})")
    other = sum(count for message, count in (run.hook_errors or {}).items() if message.split(":", 1)[0] not in lost)
    if other:
        parts.append(f"{other} other hook error(s): counts may be off")
    return "hook errors: " + "; ".join(parts) + " (run.hook_errors has the messages)"
