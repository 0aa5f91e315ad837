"""The engines' plugin entry points cost nothing to a process that does not capture.

vLLM and SGLang import every plugin entry point of the environment in each of their processes;
with ``FI_PROFILE_CAPTURE`` unset, fi-profile's must import nothing heavy and patch nothing. (Its
import time is measured by ``benchmarks/plugin_import_cost.py``, not here.)
"""

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
before = set(sys.modules)
import {module} as plugin
plugin.register()
new = {{m.split(".")[0] for m in set(sys.modules) - before}}
print(json.dumps({{"new": sorted(new), "installed": plugin.STATUS["installed"]}}))
"""


@pytest.mark.parametrize("module", ["hooks.vllm_plugin", "hooks.sglang_plugin"])
def test_plugin_with_capture_off_imports_nothing_heavy_and_patches_nothing(module):
    env = {k: v for k, v in os.environ.items() if k != "FI_PROFILE_CAPTURE"}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["installed"] == []
    assert not set(result["new"]) & {"torch", "numpy", "pydantic", "safetensors", "profiler", "vllm", "sglang", "nvtx", "rich"}
