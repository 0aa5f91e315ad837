"""Time the hook path alone: microseconds a hooked call adds, per recorder state.

A plain function stands for the engine method; it is wrapped like ``UnquantizedLinearMethod.apply``
(a GEMM call on a [3, 256] input). States: inactive (capture off), recorded (a step being learned:
op table, Definition lookup, recorder), replayed (a known step: count only).

  python benchmarks/hook_call_cost.py --calls 50000
"""

from __future__ import annotations

import argparse
import platform
import time
from collections import Counter

import torch

from fi_profile.capture.learned_steps import LearnedStep, StepReplay
from fi_profile.capture.patching import wrap
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import gemm


def per_call_us(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50000)
    args = parser.parse_args()

    weight = torch.zeros(512, 256, dtype=torch.bfloat16)
    x = torch.zeros(3, 256, dtype=torch.bfloat16)

    def method(x):
        return x

    hooked = wrap(method, "gemm", lambda x: [gemm.call(x, *weight.shape)])
    base = per_call_us(method, (x,), args.calls)
    results = {}
    RECORDER.active = False
    results["inactive"] = per_call_us(hooked, (x,), args.calls) - base
    RECORDER.active = True
    RECORDER.reset()
    results["recorded"] = per_call_us(hooked, (x,), args.calls) - base
    RECORDER.begin_step("shape")
    hooked(x)
    RECORDER.begin_step("shape")  # learned one call; now replay it, over and over
    RECORDER.replay = StepReplay(LearnedStep(Counter(), Counter(), RECORDER.replay.step.labels * args.calls, ()))
    results["replayed"] = per_call_us(hooked, (x,), args.calls) - base
    RECORDER.active = False
    import fi_profile.capture.patching

    nvtx = "on" if fi_profile.capture.patching._push is not None else "off (no NVTX tool attached; FI_PROFILE_NVTX=1 forces it)"
    print(f"{platform.processor() or platform.machine()}, python {platform.python_version()}, {args.calls} calls, NVTX {nvtx}")
    for state, us in results.items():
        print(f"  {state:9s} +{us:.2f} us per call")


if __name__ == "__main__":
    main()
