"""What the replay's ``kernels`` timer costs per pair, beside the ``events`` timer, on a GPU.

  python benchmarks/kernels_timer_cost.py [--pairs 20] [--json kernels_timer_cost.json]

Each case is one call of a decode-sized op (an RMSNorm over 64 tokens, a 64 x 4096 x 4096 GEMM, a
chain of ten small kernels, a reference's Python loop over 64 requests of 512 kernels in all);
each is timed ``--pairs`` times by ``fi_profile.replay.timing.measure`` with the default stopping
rule, as a replay times one pair:

- ``events``: CUDA events around each call;
- ``kernels``: the call's own kernels' durations from CUPTI, through
  ``fi_profile.replay.timing.KernelSession`` (torch's Kineto binding, no Python post-processing);
- ``kernels_torch_profiler``: the same batches, each session through ``torch.profiler.profile`` (as
  replay used it before);
- ``kernels_no_lead``: the kernels timer without the spin kernel that leads each call (the host
  enqueues while it spins, so that events time the device, not the launches; the kernels' own
  durations leave the gaps out anyway): what a host-bound call (a reference's Python loop) would
  save per pair if the kernels timer went without it.

Per case and timer: the wall time of one ``measure`` (median over the pairs), the calls it timed
and the median it reported. The difference between the ``kernels`` rows and ``events`` is what the
kernels timer adds to each pair of a replay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

from fi_profile.replay import timing


class TorchProfilerSession:
    """The session replay used before: ``torch.profiler.profile`` around the timed loop."""

    def __init__(self) -> None:
        self._profile = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])

    def __enter__(self):
        self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        self._profile.__exit__(*exc)

    def events(self):
        return self._profile.profiler.kineto_results.events()


def cases(device: torch.device) -> dict[str, callable]:
    x = torch.randn(64, 4096, device=device, dtype=torch.bfloat16)
    w = torch.randn(4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)

    def rmsnorm():
        return torch.nn.functional.rms_norm(x, (4096,), w, 1e-5)

    def gemm():
        return x @ b

    def chain():
        y = x
        for _ in range(10):
            y = y * 1.0001
        return y

    rows = [x[i:i + 1] for i in range(64)]

    def per_request_loop():  # a reference's loop over 64 requests, 8 small kernels each
        out = []
        for row in rows:
            y = row
            for _ in range(8):
                y = y * 1.0001
            out.append(y)
        return out

    return {"rmsnorm_t64": rmsnorm, "gemm_m64_n4096_k4096": gemm, "chain_of_10": chain,
            "per_request_loop_512": per_request_loop}


def time_pairs(call, device, timer: str, session, pairs: int, lead: bool = True) -> dict:
    walls, reps, medians = [], [], []
    cycles = timing._sleep_cycles_per_ms if lead else (lambda device: 0.0)
    with mock.patch.object(timing, "KernelSession", session), mock.patch.object(timing, "_sleep_cycles_per_ms", cycles):
        for _ in range(pairs):
            start = time.perf_counter()
            measured = timing.measure(call, lambda: None, device, timer=timer)
            walls.append(time.perf_counter() - start)
            stats = measured.stats()
            reps.append(stats["repetitions"])
            medians.append(stats["median_ms"])
    return {"wall_s_median": statistics.median(walls), "wall_s_first": walls[0], "calls_median": statistics.median(reps),
            "median_ms": statistics.median(medians), "method": stats["method"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = []
    for name, call in cases(device).items():
        for label, timer, session, lead in (("events", "events", timing.KernelSession, True),
                                            ("kernels", "kernels", timing.KernelSession, True),
                                            ("kernels_torch_profiler", "kernels", TorchProfilerSession, True),
                                            ("kernels_no_lead", "kernels", timing.KernelSession, False)):
            row = {"case": name, "timer": label, **time_pairs(call, device, timer, session, args.pairs, lead)}
            rows.append(row)
            print(f"{name:22} {label:24} {row['wall_s_median'] * 1e3:8.1f} ms/pair (first {row['wall_s_first'] * 1e3:7.1f})"
                  f"  {row['calls_median']:6.0f} calls  median {row['median_ms'] * 1e3:8.2f} us  {row['method']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
