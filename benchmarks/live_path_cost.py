"""Host cost of full capture's live attention path on a GPU, per decode step, with the GPU kept
busy ahead of the host (so a synchronizing call would show up as the spin time) and torch's sync
debug mode set to raise on a synchronizing call.

  python benchmarks/live_path_cost.py --requests 32 --context 300 --layers 32
"""

from __future__ import annotations

import argparse
import time

import torch

from fi_profile.capture.paged_layout import paged_batches
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import attention
from fi_profile.schema.dtype import DType


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--context", type=int, default=300, help="KV tokens per request (page size 1)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    n, device = args.requests, torch.device("cuda")
    columns = args.context + args.steps + 5  # the longest request of the run
    req_to_token = torch.arange(2 * n * columns, dtype=torch.int32, device=device).reshape(2 * n, columns)
    pool = torch.arange(n, device=device)
    query_start_loc = torch.arange(n + 1, dtype=torch.int64)  # decode: one query token per request
    RECORDER.reset()
    RECORDER.active = True
    torch.cuda.set_sync_debug_mode("error")
    totals: dict[str, float] = {}
    for step in range(args.steps + 5):
        if step >= 5:
            torch.cuda._sleep(2_000_000)  # about a millisecond of device work ahead of the host
        times = []
        times.append(time.perf_counter())
        table = req_to_token[pool]  # SGLang: the request-to-token rows are the page ids
        times.append(time.perf_counter())
        decode, prefill = paged_batches(query_start_loc, torch.full((n,), args.context + step, dtype=torch.int64), table, 1)
        times.append(time.perf_counter())
        calls = attention.layer_calls(decode, prefill, 32, 8, 128, 1, 1 << 20, DType.bfloat16, 0.088)
        times.append(time.perf_counter())
        RECORDER.record(calls, "attention", False)  # a new workload every step
        times.append(time.perf_counter())
        for _ in range(args.layers - 1):
            RECORDER.record(calls, "attention", False)
        times.append(time.perf_counter())
        if step >= 5:
            for name, t0, t1 in zip(("block table rows", "paged_batches", "paged_attention_calls", "record (new workload)",
                                     f"record x{args.layers - 1} (same workload)"), times, times[1:]):
                totals[name] = totals.get(name, 0.0) + t1 - t0
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}: host time per decode step, no synchronizing call seen")
    for name, total in totals.items():
        print(f"  {name:32s} {total / args.steps * 1e6:8.1f} us")
    print(f"  {'total':32s} {sum(totals.values()) / args.steps * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
