"""The engines' RMSNorm kernels (vLLM ``_C``, FlashInfer) timed as replay times them, beside the
copy-timed way the shipped baselines used to run them, and their achieved bandwidth.

  python benchmarks/norm_natives.py --capture CAPTURE_DIR --json norm_natives.json

``fused_add_rmsnorm`` works in place on ``hidden_states`` and ``residual``. Replay now hands it
fresh copies of both before each call, outside the timed region (``spec.overwrites``); before,
the baselines cloned both inputs inside the timed call, so the copies were timed too. Both ways
are timed here with ``fi_profile.replay.timing.measure`` (cold L2, events), at the largest token
count of the capture's workloads (``--capture``) and at ``--tokens``. Bandwidth: the fewest bytes
the op must move (read x, residual and the weight; write both back) over its median time, against
a measured device-to-device copy.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from replay_gpu import copy_bandwidth  # this folder's: a measured device-to-device copy

from fi_profile.catalog import shipped_definition
from fi_profile.replay.baseline_solutions import native_solutions
from fi_profile.replay.evaluate import _bound, _solution_calling
from fi_profile.replay.timing import measure

HIDDEN = 4096


def largest_batch(capture: Path, definition: str) -> int:
    """The largest ``batch_size`` among a capture's workloads of ``definition``."""
    path = next(capture.glob(f"workloads/*/{definition}.jsonl"))
    return max(json.loads(line)["workload"]["axes"]["batch_size"] for line in path.read_text().splitlines() if line.strip())


def time_native(name: str, tokens: int, device: torch.device) -> dict[str, dict[str, float]]:
    """library -> {in_place_us, copy_timed_us, bytes} for ``name`` at ``tokens``."""
    definition = shipped_definition(name)
    inputs = {
        "hidden_states": torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device=device),
        "weight": torch.randn(HIDDEN, dtype=torch.bfloat16, device=device),
    }
    if "residual" in definition.inputs:
        inputs["residual"] = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device=device)
    activations = sum(v.numel() for k, v in inputs.items() if k != "weight")
    nbytes = 2 * (2 * activations + HIDDEN)  # read and write each activation once, read the weight
    rows = {}
    natives = native_solutions(definition)
    if not natives:
        raise SystemExit(f"{name}: no native kernel imports here (needs CUDA and vLLM or FlashInfer)")
    for solution in natives:
        calling = _solution_calling(definition, solution)
        reference = {n: torch.empty(tokens, HIDDEN, dtype=torch.bfloat16, device=device) for n in definition.outputs}
        call, prepare = _bound(definition, calling, inputs, reference, device)
        in_place = statistics.median(measure(call, prepare, device).times_ms)
        row = {"in_place_us": in_place * 1e3, "bytes": nbytes}
        if calling.overwrites:  # the old way: both inputs cloned inside the timed call

            def copy_timed(calling=calling):
                return calling.run(**{n: v.clone() if n in calling.overwrites else v for n, v in inputs.items()})

            row["copy_timed_us"] = statistics.median(measure(copy_timed, lambda: None, device).times_ms) * 1e3
        rows[solution.name.rsplit("__", 1)[-1]] = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path, help="a capture folder: its largest fused_add_rmsnorm batch is timed")
    parser.add_argument("--tokens", type=int, nargs="*", default=[14509], help="more token counts to time")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("norm_natives: needs a CUDA device")
    device = torch.device("cuda:0")
    tokens = list(args.tokens)
    if args.capture is not None:
        tokens.insert(0, largest_batch(args.capture, "fused_add_rmsnorm_inplace_h4096"))
    bandwidth = copy_bandwidth(device)
    summary = {"device": torch.cuda.get_device_name(), "copy_bandwidth_GBps": bandwidth / 1e9, "rows": []}
    print(f"{summary['device']}: device-to-device copy {bandwidth / 1e9:.0f} GB/s (read + write)")
    for name in ("fused_add_rmsnorm_inplace_h4096", "rmsnorm_h4096"):
        for m in tokens:
            for library, row in time_native(name, m, device).items():
                row.update(definition=name, tokens=m, library=library,
                           share_of_copy=row["bytes"] / (row["in_place_us"] * 1e-6) / bandwidth)
                summary["rows"].append(row)
                copy = f"  copy-timed {row['copy_timed_us']:8.1f} us" if "copy_timed_us" in row else ""
                print(f"{name:24s} M={m:6d} {library:10s} in place {row['in_place_us']:8.1f} us{copy}  "
                      f"{row['bytes'] / (row['in_place_us'] * 1e-6) / 1e9:6.0f} GB/s = {row['share_of_copy']:.0%} of copy")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
