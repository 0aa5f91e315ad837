"""A record from what a stopped capture left: its engine processes save their parts every
``--save-every`` seconds (``.fi-profile/parts/``), and the capture writes how it was run
(``.fi-profile/capture.json``) as it starts. ``fi-profile recover DIR`` merges them into the record
a killed run never wrote, marked incomplete: it loses at most one save interval.

Every file the capture writes is written whole or not at all
(:func:`fi_profile.capture.output.write_atomically`): a capture killed while it writes leaves the
previous file, never half of one."""

from __future__ import annotations

import json
from pathlib import Path

from fi_profile.capture.output import CaptureSummary, merge_parts, write_atomically
from fi_profile.capture.recorder import PARTS_DIR
from fi_profile.schema.run_info import RunInfo

#: how the capture in a folder was run, written as it starts
CAPTURE_FILE = ".fi-profile/capture.json"


class NothingToRecover(Exception):
    """The folder holds no part of a capture (or not how it was run)."""


def remember(out_dir: Path, model: str, framework: str, max_workloads: int, run: RunInfo) -> None:
    """Write how the capture is run, for :func:`recover`."""
    write_atomically(out_dir / CAPTURE_FILE, json.dumps({
        "model": model, "framework": framework, "max_workloads": max_workloads,
        "run": run.model_dump(mode="json", exclude_none=True)}, indent=1) + "\n")


def recover(out_dir: Path) -> CaptureSummary:
    """The record, Definitions and workloads of the capture in ``out_dir`` from the parts its engine
    processes saved, marked incomplete; :class:`NothingToRecover` where there is none."""
    parts = sorted((out_dir / PARTS_DIR).glob("*.json"))
    if not parts:
        raise NothingToRecover(f"nothing to recover in {out_dir}: no part of a capture in {out_dir / PARTS_DIR}")
    try:
        how = json.loads((out_dir / CAPTURE_FILE).read_text())
        run = RunInfo.model_validate(how["run"])
        model, framework, max_workloads = str(how["model"]), str(how["framework"]), int(how["max_workloads"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NothingToRecover(f"nothing to recover in {out_dir}: {out_dir / CAPTURE_FILE} is missing or unreadable "
                               f"({type(exc).__name__}: {exc})") from None
    stopped = (f"the capture stopped before it ended; recovered from the {len(parts)} part(s) its engine processes "
               "saved (at most one --save-every interval lost)")
    return merge_parts(out_dir, model, framework, max_workloads, run, stopped)
