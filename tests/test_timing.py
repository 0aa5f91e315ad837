"""Replay's timers and L2 state, on what can be checked without a GPU: which inputs count as a
step's (read back into the L2 under ``--warm-inputs``), how the ``kernels`` timer sums each call's
own kernels out of a profile, and that a bad timer is refused."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from fi_profile.catalog import shipped_definition
from fi_profile.replay.evaluate import per_step_inputs
from fi_profile.replay.timing import TIMED_RANGE, KernelSession, _kernel_times, _timed_range, measure


def test_a_steps_inputs_are_its_activations_not_its_weights_or_kv_cache():
    assert per_step_inputs(shipped_definition("gemm_bf16_n4096_k4096")) == ["A"]
    assert per_step_inputs(shipped_definition("fused_add_rmsnorm_inplace_h4096")) == ["hidden_states", "residual"]
    decode = per_step_inputs(shipped_definition("gqa_paged_decode_h32_kv8_d128_ps16"))
    assert "q" in decode and "k_cache" not in decode and "v_cache" not in decode
    moe = per_step_inputs(shipped_definition("moe_bf16_renorm_topk2_e8_h4096_i14336"))
    assert "hidden_states" in moe and not any("weight" in name for name in moe)


@dataclass
class Event:
    """What the ``kernels`` timer reads of a Kineto event."""

    name_: str
    start: int
    duration: int
    cpu: bool
    correlation: int = 0
    linked: int = 0

    def name(self):
        return self.name_

    def start_ns(self):
        return self.start

    def duration_ns(self):
        return self.duration

    def device_type(self):
        return torch.autograd.DeviceType.CPU if self.cpu else torch.autograd.DeviceType.CUDA

    def correlation_id(self):
        return self.correlation

    def linked_correlation_id(self):
        return self.linked

    def is_user_annotation(self):
        return False


class Profile:
    """A finished KernelSession's view: its events."""

    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_the_kernels_timer_sums_each_calls_own_kernels_and_leaves_the_flush_out():
    events = [
        # call 0: two kernels launched inside its range (one through an operator, one a Triton
        # kernel's bare launch); the flush before it launched outside any
        Event("cudaLaunchKernel", 0, 5, True, correlation=7001), Event("reduce_kernel", 10, 40_000, False, 7001),
        Event(TIMED_RANGE, 100, 50, True, correlation=1),
        Event("aten::mm", 105, 20, True, correlation=2),
        Event("cuLaunchKernelEx", 110, 5, True, correlation=7002, linked=2), Event("gemm", 200, 3_000, False, 7002, 2),
        Event("cuLaunchKernel", 130, 5, True, correlation=7003), Event("triton_", 3_300, 500, False, 7003),
        # call 1: one kernel; an operator's id equal to a kernel's correlation id is no launch
        Event(TIMED_RANGE, 10_000, 50, True, correlation=3),
        Event("cudaLaunchKernel", 10_010, 5, True, correlation=7004), Event("gemm", 20_000, 2_000, False, 7004),
        Event("aten::add", 10_020, 5, True, correlation=7005), Event("unlinked", 30_000, 9_999, False, 7005),
    ]
    assert _kernel_times(Profile(events), 2) == pytest.approx([3.5e-3, 2e-3])
    with pytest.raises(RuntimeError, match="2 timed ranges for 3 calls"):
        _kernel_times(Profile(events), 3)


def test_an_unknown_timer_is_refused():
    with pytest.raises(ValueError, match="timer 'wall'"):
        measure(lambda: None, lambda: None, torch.device("cpu"), timer="wall")


def test_a_kernel_session_sees_each_timed_range_and_starts_again_for_the_next_pair():
    """Kineto wants a prepare before every start (a second start without one crashed the process)."""
    a = torch.randn(64, 64)
    for calls in (3, 5):
        with KernelSession(activities=(torch.autograd.ProfilerActivity.CPU,)) as session:
            for _ in range(calls):
                with _timed_range("kernels"):
                    torch.mm(a, a)
        ranges = [e for e in session.events() if e.name() == TIMED_RANGE]
        assert len(ranges) == calls
        assert any(e.name() == "aten::mm" for e in session.events())
