"""Does capture make the engine wait for the GPU? Runs one capture in this process
(``--single-process``) with torch's sync debug mode on and counts every synchronizing CUDA call, by
where it came from: the engine's construction (profiling, graph capture) or the steps.

  python benchmarks/sync_audit.py --model fi-profile/tiny-llama --framework vllm --single-process \
      --count-only --out /tmp/audit          # any fi-profile capture arguments

A step-time sync (``.item()``, ``.cpu()``, ``.tolist()`` of a device tensor) stalls the engine's
asynchronous scheduling: the host waits for the GPU every step. Those whose stack passes through
fi-profile's hooks are listed with their frames. (Event waits are not seen by the debug mode.)
"""

from __future__ import annotations

import collections
import sys
import traceback
import warnings
from pathlib import Path

import torch

import fi_profile.capture
import fi_profile.hooks

#: fi-profile's capture code (wherever it is installed: a wheel, or this checkout)
OURS = tuple(str(Path(m.__file__).parent) for m in (fi_profile.hooks, fi_profile.capture))
seen: collections.Counter[str] = collections.Counter()
ours: collections.Counter[str] = collections.Counter()


def _show(message, category, filename, lineno, file=None, line=None) -> None:
    if "synchroniz" not in str(message):
        return
    stack = traceback.extract_stack()[:-1]
    hooks = [f for f in stack if f.filename.startswith(OURS)]
    building = any(f.name == "__init__" and Path(f.filename).name == "runner.py" for f in hooks)
    where = "engine construction" if building else "steps"
    seen[where] += 1
    if where == "steps" and hooks:
        ours[" <- ".join(f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
                         for f in reversed(hooks[-4:]))] += 1


def main() -> None:
    warnings.showwarning = _show
    warnings.simplefilter("always")
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("warn")
    from fi_profile.cli import app

    code = 1
    try:
        returned = app(sys.argv[1:], standalone_mode=False)  # an exit code where the command exited
        code = returned if isinstance(returned, int) else 0
    finally:
        print(f"synchronizing CUDA calls: {dict(seen) or 0}; in steps through fi-profile's hooks: {sum(ours.values())}")
        for frames, n in ours.most_common(20):
            print(f"  {n:6d}  {frames}")
    sys.exit(code)


if __name__ == "__main__":
    main()
