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
new = set(sys.modules) - before
ours = sorted(m for m in new if m.startswith("fi_profile"))
print(json.dumps({{"new": sorted({{m.split(".")[0] for m in new}}), "ours": ours, "installed": plugin.STATUS["installed"]}}))
"""


@pytest.mark.parametrize("module", ["fi_profile.hooks.vllm.plugin", "fi_profile.hooks.sglang.plugin"])
def test_plugin_with_capture_off_imports_nothing_heavy_and_patches_nothing(module):
    env = {k: v for k, v in os.environ.items() if k != "FI_PROFILE_CAPTURE"}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["installed"] == []
    assert not set(result["new"]) & {"torch", "numpy", "pydantic", "safetensors", "vllm", "sglang", "nvtx", "rich"}
    engine_package = module.rsplit(".", 1)[0]  # the plugin and the packages above it, nothing else of ours
    assert result["ours"] == sorted(["fi_profile", "fi_profile.hooks", engine_package, module])
