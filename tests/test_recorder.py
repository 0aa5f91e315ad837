"""The recorder's step learning and replay, driven through real hook wrappers."""

import torch

from hooks.patching import wrap, wrap_boundary
from profiler.capture import ops
from profiler.capture.recorder import RECORDER, Recorder


def make_hooks():
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    ran = []

    def linear(x):
        ran.append(x.shape[0])
        return x

    hooked_linear = wrap(linear, "gemm", lambda x: [ops.gemm(x, weight)])
    boundary = wrap_boundary(lambda sig: None, "step", lambda sig: RECORDER.begin_step(sig))
    return hooked_linear, boundary, ran


def step(hooked_linear, boundary, tokens, calls):
    boundary(("tokens", tokens))
    for _ in range(calls):
        hooked_linear(torch.zeros(tokens, 32, dtype=torch.bfloat16))


def test_replayed_steps_count_like_recorded_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    hooked_linear, boundary, ran = make_hooks()
    step(hooked_linear, boundary, 5, 3)  # learned
    step(hooked_linear, boundary, 1, 3)  # learned
    for _ in range(4):
        step(hooked_linear, boundary, 1, 3)  # replayed
    RECORDER.flush(tmp_path)
    assert RECORDER.step_stats == {"learned": 2, "replayed": 4}
    assert RECORDER.calls == {"gemm_n64_k32": 18} and len(ran) == 18
    assert RECORDER.workloads == {("gemm_n64_k32", (("M", 5),)): 3, ("gemm_n64_k32", (("M", 1),)): 15}
    assert not RECORDER.errors


def test_replay_mismatch_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    hooked_linear, boundary, _ = make_hooks()
    step(hooked_linear, boundary, 2, 3)
    step(hooked_linear, boundary, 2, 2)  # same signature, one call fewer
    RECORDER.flush(tmp_path)
    (message,) = RECORDER.errors
    assert message.startswith("step replay: 2 hooked calls where the learned step had 3")


def test_without_boundaries_every_call_is_recorded(tmp_path):
    recorder = Recorder()
    call = ops.gemm(torch.zeros(4, 32), torch.zeros(8, 32))
    for _ in range(3):
        recorder.record([call], "gemm")
    assert recorder.calls == {"gemm_n8_k32_float32": 3} and recorder.step_stats == {}
