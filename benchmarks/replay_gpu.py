"""Replay on a GPU: timing repeatability, agreement with ``triton.testing.do_bench``, replay
throughput and achieved bandwidth, on Llama-3.1-8B Definitions with synthesized workloads.

  python benchmarks/replay_gpu.py --out /tmp/replay-gpu            # writes summary.json there

1. Timing: ``fi_profile.replay.timing.measure`` on one kernel per family, three times (CV of the
   three medians), alternating with ``triton.testing.do_bench`` (median, its own L2 flush) on the
   same call.
2. Throughput: ``fi-profile replay`` over a dataset of rmsnorm / fused_add_rmsnorm workloads with
   every baseline; checked-and-timed pairs per minute from the wall clock.
3. Bandwidth: the fewest bytes an rmsnorm must move over its median time, against a measured
   device-to-device copy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fi_profile.catalog import shipped_definition
from fi_profile.replay.timing import measure

TOKENS = (1, 32, 256, 2048, 8192)


def kernels(device: torch.device) -> dict[str, tuple]:
    """name -> (call, bytes moved at least)."""
    out = {}
    for m in (32, 8192):
        x = torch.randn(m, 4096, dtype=torch.bfloat16, device=device)
        w = torch.randn(4096, dtype=torch.bfloat16, device=device)
        out[f"rmsnorm_h4096 M={m}"] = (lambda x=x, w=w: F.rms_norm(x, (4096,), w, 1e-5), 2 * x.numel() * 2 + w.numel() * 2)
        a = torch.randn(m, 4096, dtype=torch.bfloat16, device=device)
        b = torch.randn(14336 * 2, 4096, dtype=torch.bfloat16, device=device)
        out[f"gemm_bf16_n28672_k4096 M={m}"] = (lambda a=a, b=b: F.linear(a, b), (a.numel() + b.numel() + m * b.shape[0]) * 2)
        g = torch.randn(m, 2 * 14336, dtype=torch.bfloat16, device=device)
        out[f"silu_and_mul_i14336 M={m}"] = (lambda g=g: F.silu(g[:, :14336]) * g[:, 14336:], g.numel() * 2 * 3 // 2)
    return out


def copy_bandwidth(device: torch.device) -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    m = measure(lambda: dst.copy_(src), lambda: None, device, min_time_s=0.2)
    return 2 * src.numel() / (statistics.median(m.times_ms) * 1e-3)  # read + write, bytes/s


def write_dataset(root: Path, per_definition: int) -> None:
    import random

    for name in ("rmsnorm_h4096", "fused_add_rmsnorm_inplace_h4096"):
        d = shipped_definition(name)
        (root / "definitions" / d.op_type).mkdir(parents=True, exist_ok=True)
        (root / "definitions" / d.op_type / f"{name}.json").write_text(d.to_json())
        (root / "workloads" / d.op_type).mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        lines = [
            json.dumps({"definition": name, "workload": {"uuid": f"{name}-{i}", "axes": {"batch_size": rng.choice(TOKENS) + i},
                        "inputs": {n: {"type": "random"} for n in d.inputs}, "count": 1}})
            for i in range(per_definition)
        ]
        (root / "workloads" / d.op_type / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workloads", type=int, default=10, help="per norm Definition, for the throughput run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda:0")
    import triton
    from triton.testing import do_bench

    summary: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    bandwidth = copy_bandwidth(device)
    summary["copy_bandwidth_GBps"] = bandwidth / 1e9
    print(f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s (read + write)", flush=True)
    rows = {}
    for name, (call, nbytes) in kernels(device).items():
        for graph in (False, True):
            # ours and do_bench alternate, three runs each, so that drift (clocks, heat) hits both
            medians, theirs_runs = [], []
            for _ in range(3):
                measured = measure(call, lambda: None, device, cuda_graph=graph)
                medians.append(statistics.median(measured.times_ms))
                theirs_runs.append(do_bench(call, warmup=25, rep=100, return_mode="median"))
            ours, theirs = statistics.median(medians), statistics.median(theirs_runs)
            row = rows[f"{name} {'cuda_graph' if graph else 'cuda_events'}"] = {
                "median_ms_3_runs": medians,
                "cv_of_medians": statistics.pstdev(medians) / statistics.fmean(medians),
                "host_lead_us": measured.host_lead_us,
                "do_bench_median_ms_3_runs": theirs_runs,
                "do_bench_cv": statistics.pstdev(theirs_runs) / statistics.fmean(theirs_runs),
                "vs_do_bench": ours / theirs - 1,
                "bandwidth_share_of_copy": nbytes / (ours * 1e-3) / bandwidth,
            }
            print(f"{name:30s} {'graph ' if graph else 'events'} {ours * 1e3:9.2f} us  CV {row['cv_of_medians']:.2%}  "
                  f"do_bench {theirs * 1e3:9.2f} us (CV {row['do_bench_cv']:.2%}, {row['vs_do_bench']:+.1%})  "
                  f"lead {measured.host_lead_us:.0f} us  {row['bandwidth_share_of_copy']:.0%} of copy bandwidth", flush=True)
    summary["kernels"] = rows
    dataset = args.out / "dataset"
    write_dataset(dataset, args.workloads)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", "from fi_profile.cli import app; app()", "replay", str(dataset),
         "--out", str(args.out / "results")],
        capture_output=True, text=True,
    )
    wall = time.perf_counter() - start
    (args.out / "replay.log").write_text(proc.stdout + proc.stderr)
    results = [json.loads(line) for line in (args.out / "results" / "results.jsonl").read_text().splitlines() if line.strip()]
    summary["throughput"] = {
        "pairs": len(results),
        "passed": sum(r["status"] == "passed" for r in results),
        "wall_s": wall,
        "pairs_per_minute": 60 * len(results) / wall,
        "solutions": sorted({r["source"].rsplit("__", 1)[-1] for r in results}),
    }
    print(json.dumps(summary["throughput"]), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
