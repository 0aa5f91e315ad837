"""What an installed fi-profile costs a vLLM or SGLang process that does not capture.

Both engines import every plugin entry point of the environment in each of their processes; with
``FI_PROFILE_CAPTURE`` unset, the plugin must import nothing heavy and return at once. Each
measurement runs in a fresh interpreter (``-X importtime``: the plugin module's cumulative import
time, its package included, after the standard-library modules every engine process has already
imported) and times ``register()`` there; the median of ``--runs`` is printed,
with vLLM's whole ``load_general_plugins()`` (entry-point discovery included) for scale, and the
modules the plugin pulled in. Target: import + register <= 5 ms.

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

PROBE = PRELOADED + r"""
before = set(sys.modules)
import {module} as plugin
start = time.perf_counter()
plugin.register()
register_us = (time.perf_counter() - start) * 1e6
heavy = sorted({{m.split(".")[0] for m in set(sys.modules) - before}} & {{"torch", "pydantic", "safetensors", "numpy", "profiler", "vllm", "sglang", "nvtx", "rich"}})
print("PROBE " + json.dumps({{"register_us": register_us, "heavy": heavy}}))
"""

ENGINE_PROBE = PRELOADED + r"""
import vllm.plugins as plugins
start = time.perf_counter()
plugins.load_general_plugins()
print("PROBE " + json.dumps({"load_general_plugins_us": (time.perf_counter() - start) * 1e6}))
"""


def run_probe(code: str) -> tuple[dict, dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k != "FI_PROFILE_CAPTURE"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, env=env, check=True)
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("PROBE "))[6:])
    cumulative = {}
    for line in proc.stderr.splitlines():  # import time: self [us] | cumulative | imported package
        if line.startswith("import time:") and "|" in line:
            _, cum, name = (part.strip() for part in line[len("import time:"):].split("|"))
            if cum.isdigit():
                cumulative[name.strip()] = int(cum)
    return result, cumulative


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, python {platform.python_version()}, median of {args.runs} fresh interpreters")
    for module in ("hooks.vllm_plugin", "hooks.sglang_plugin"):
        totals, heavy = [], set()
        for _ in range(args.runs):
            result, cumulative = run_probe(PROBE.format(module=module))
            totals.append(cumulative.get(module, 0) + result["register_us"])
            heavy.update(result["heavy"])
        print(f"  {module}: import + register() {statistics.median(totals) / 1000:.2f} ms "
              f"(min {min(totals) / 1000:.2f}, max {max(totals) / 1000:.2f}); packages pulled in: {sorted(heavy) or 'none'}")
    try:
        engine = [run_probe(ENGINE_PROBE)[0]["load_general_plugins_us"] for _ in range(min(args.runs, 5))]
        print(f"  for scale: vllm.plugins.load_general_plugins() {statistics.median(engine) / 1000:.1f} ms "
              "(every entry point of the environment, discovery included)")
    except subprocess.CalledProcessError:
        print("  (vLLM not installed here: no engine-side measurement)")


if __name__ == "__main__":
    main()
