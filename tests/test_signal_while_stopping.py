"""A signal that reaches fi-profile after the generation, while its engine stops and writes its
part or while the parts merge, keeps the record (CI, 2026-12-04: a SIGINT on a loaded machine
landed in vLLM's stop call, and the run exited 130 with no record). An in-process engine with the
real recorder, whose calls the signal interrupts."""

from __future__ import annotations

import signal

import pytest
import torch

from fi_profile.capture import engine_run
from fi_profile.capture.engine_run import HookStatus, Scenario, run_capture
from fi_profile.capture.interruption import Interrupted
from fi_profile.capture.options import CaptureOptions
from fi_profile.capture.patching import wrap
from fi_profile.capture.recorder import RECORDER, save_whole_steps, start_recording, stop_recording
from fi_profile.families import gemm


class _Engine:
    """One process, the recorder's own: ``steps`` GEMM calls, then a signal at ``signal_at``."""

    framework, version, attention_backend = "vLLM", "vllm test", "default"

    def __init__(self, model, scenario, engine, capture=True, signal_at="stop", steps=5):
        self.signal_at, self.steps, self.saves = signal_at, steps, 0
        self.linear = wrap(lambda x: x, "gemm", lambda x: [gemm.call(x, 64, 32)])

    def start(self, count_only, out_dir, autosave_s):
        start_recording(count_only=count_only, out_dir=str(out_dir), autosave_s=1000.0, page_size=16, num_pages=0)
        return HookStatus()

    def generate(self, scenario):
        for _ in range(self.steps):
            RECORDER.begin_step(("tokens", 4))
            self.linear(torch.zeros(4, 32, dtype=torch.bfloat16))
        RECORDER.begin_step(("end",))  # the last step ends at the next boundary
        return [[1]]

    def stop(self, out_dir):
        if self.signal_at == "before stop":  # the signal while the stop was on its way
            raise Interrupted(signal.SIGINT)
        stop_recording(str(out_dir))
        if self.signal_at == "stop":  # the part written; the signal while its answer came back
            raise Interrupted(signal.SIGINT)

    def save(self, out_dir):
        self.saves += 1
        save_whole_steps(str(out_dir))

    def shutdown(self):
        RECORDER.active = False


@pytest.mark.parametrize("signal_at", ["before stop", "stop", "merge"])
def test_a_signal_after_the_generation_keeps_every_step(tmp_path, monkeypatch, signal_at):
    made = []

    def engine(*args, **kwargs):
        made.append(_Engine(*args, signal_at=signal_at, **kwargs))
        return made[-1]

    if signal_at == "merge":
        merge = engine_run.merge_parts

        def interrupted_merge(*args, **kwargs):
            monkeypatch.setattr(engine_run, "merge_parts", merge)  # the merge at the signal runs
            raise Interrupted(signal.SIGINT)

        monkeypatch.setattr(engine_run, "merge_parts", interrupted_merge)
    RECORDER.reset()
    options = CaptureOptions.of("m", tmp_path, Scenario(num_prompts=1, input_len=4, output_len=5),
                                kernel_accounting=False)
    with pytest.raises(Interrupted) as stopped:
        run_capture(engine, options)
    assert made[0].saves == 1 and stopped.value.unanswered is None
    summary = stopped.value.summary
    assert summary is not None, "the signal after the generation lost the record"
    assert {k.id: k.count for k in summary.record.kernels} == {"gemm_bf16_n64_k32": 5}
    assert "interrupted by SIGINT" in summary.record.run.incomplete
    assert (tmp_path / "record.json").is_file()
