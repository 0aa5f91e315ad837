"""A replay stopped by a signal keeps and reports what it finished: the workloads whose pairs all
ran are in results.jsonl, the tables are printed over them, and it exits 128 + the signal at once
(not after the pair it was on); ``--resume`` then runs the rest. Its warm-ups stop with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest
from test_replay import ADVERSARIAL, RMSNORM, solution, write_dataset

from fi_profile.replay import prewarm


def _results(path):
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_replay_reports_the_workloads_it_finished_and_resume_runs_the_rest(tmp_path, stop):
    root, out = tmp_path / "dataset", tmp_path / "results"
    root.mkdir()
    write_dataset(root)
    _, sleeps = ADVERSARIAL["sleeps"]  # a pair that would hold the replay for 60 s
    solutions = tmp_path / "sleeps.json"
    solutions.write_text(json.dumps(solution("sleeps", RMSNORM, sleeps)))
    args = [sys.executable, "-c", "from fi_profile.cli import app; app()", "replay", str(root), "--out", str(out), "--device", "cpu",
            "--solutions", f"baselines,{solutions}", "--timeout", "120", "--min-time", "0.01"]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not _results(out / "results.jsonl") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(stop)
    signalled = time.monotonic()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + stop, stderr
    assert time.monotonic() - signalled < 30  # the sleeping pair was killed, not waited for

    kept = _results(out / "results.jsonl")
    by_workload = defaultdict(set)
    for result in kept:
        by_workload[result["workload"]].add(result["source"])
    assert by_workload and "reference" in set.union(*by_workload.values())
    for workload, sources in by_workload.items():  # whole workloads: the reference and every baseline of it
        assert "reference" in sources and any(s.endswith("__torch") for s in sources), (workload, sources)
    assert not any(r["source"] == "sleeps" for r in kept)  # the pair it was stopped on left nothing
    assert "best solution per Definition" in stdout and "test-model" in stdout
    assert f"stopped by {signal.Signals(stop).name}" in stderr and "--resume" in stderr
    assert json.loads((out / "time_breakdown.json").read_text())["pairs"] >= len(kept)

    # the rest, with the sleeper gone: --resume keeps what was kept and runs what was not
    solutions.write_text(json.dumps(solution("sleeps", RMSNORM, ADVERSARIAL["raises"][1])))
    done = subprocess.run(args + ["--resume"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    again = _results(out / "results.jsonl")
    assert [r for r in again[: len(kept)]] == kept
    assert {r["workload"] for r in again} == set(_workload_ids(root))


def _workload_ids(root):
    for path in (root / "workloads").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            yield json.loads(line)["workload"]["uuid"]


class _HangingWorker:
    """A worker whose every task runs until it is killed."""

    made: list["_HangingWorker"] = []

    def __init__(self) -> None:
        self.killed = threading.Event()
        self.started = threading.Event()
        _HangingWorker.made.append(self)

    def run(self, task, timeout_s):
        self.started.set()
        self.killed.wait(timeout_s)
        return type("Outcome", (), {"status": "crashed" if self.killed.is_set() else "timeout"})()

    def kill(self) -> None:
        self.killed.set()

    def close(self) -> None:
        self.killed.set()


def test_stopping_the_warm_ups_kills_the_running_ones_and_drops_the_rest(monkeypatch):
    """Once the pairs are done a warm-up still building only delays the results: ``stop`` kills
    those running and drops those not begun, and counts them as cancelled, not failed."""
    _HangingWorker.made = []
    monkeypatch.setattr(prewarm, "Worker", _HangingWorker)
    warm = prewarm.Prewarm(tasks=list(range(5)), timeout_s=60, workers=2)
    deadline = time.monotonic() + 10
    while sum(w.started.is_set() for w in _HangingWorker.made) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    warm.stop()
    assert time.monotonic() - began < 5
    assert warm.cancelled == 5 and not warm.failed
    assert all(w.killed.is_set() for w in _HangingWorker.made)
