"""What an installed fi-profile costs a vLLM or SGLang process that does not capture.

Both engines import every plugin entry point of the environment in each of their processes; with
``FI_PROFILE_CAPTURE`` unset, the plugin must import nothing heavy and return at once. Each
measurement runs in a fresh interpreter (after the standard-library modules every engine process
has already imported) and times the plugin's import (its packages included) and ``register()``
there. Printed: the median of ``--runs``, the packages the plugin pulled in, and vLLM's whole
``load_general_plugins()`` (entry-point discovery included) for scale. Target: <= 5 ms.

  python benchmarks/plugin_import_cost.py --runs 15
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

#: what every engine process has imported long before its plugins load (torch alone imports them)
PRELOADED = "import json, os, pathlib, sys, time, typing, dataclasses, importlib, inspect"

PROBE = (
    PRELOADED
    + r"""
before = set(sys.modules)
start = time.perf_counter()
import {module} as plugin
plugin.register()
total_us = (time.perf_counter() - start) * 1e6
heavy = {{"torch", "pydantic", "safetensors", "numpy", "vllm", "sglang", "nvtx", "rich"}}
heavy = sorted({{m.split(".")[0] for m in set(sys.modules) - before}} & heavy)
print("PROBE " + json.dumps({{"total_us": total_us, "heavy": heavy}}))
"""
)

ENGINE_PROBE = (
    PRELOADED
    + r"""
import vllm.plugins as plugins
start = time.perf_counter()
plugins.load_general_plugins()
print("PROBE " + json.dumps({"load_general_plugins_us": (time.perf_counter() - start) * 1e6}))
"""
)


def run_probe(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FI_PROFILE_CAPTURE"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("PROBE "))[6:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(
        f"{platform.processor() or platform.machine()}, python {platform.python_version()}, "
        f"median of {args.runs} fresh interpreters"
    )
    for module in ("fi_profile.hooks.vllm.plugin", "fi_profile.hooks.sglang.plugin"):
        totals, heavy = [], set()
        for _ in range(args.runs):
            result = run_probe(PROBE.format(module=module))
            totals.append(result["total_us"])
            heavy.update(result["heavy"])
        print(
            f"  {module}: import + register() {statistics.median(totals) / 1000:.2f} ms "
            f"(min {min(totals) / 1000:.2f}, max {max(totals) / 1000:.2f}); packages pulled in: {sorted(heavy) or 'none'}"
        )
    try:
        engine = [run_probe(ENGINE_PROBE)["load_general_plugins_us"] for _ in range(min(args.runs, 5))]
        print(
            f"  for scale: vllm.plugins.load_general_plugins() {statistics.median(engine) / 1000:.1f} ms "
            "(every entry point of the environment, discovery included)"
        )
    except subprocess.CalledProcessError:
        print("  (vLLM not installed here: no engine-side measurement)")


if __name__ == "__main__":
    main()
