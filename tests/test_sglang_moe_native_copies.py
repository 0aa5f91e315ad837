"""The replay imports each Solution's files afresh, so two of SGLang's MoE natives hold two copies of
``sglang_fused_experts``, and SGLang's quantization hook is the last copy's. An FP8 native built
before must still have its FP8 input served there, not quantized again from the placeholder it
passes. Run in the SGLang venv on CPU (the replay runs natives on CUDA only)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from test_capture_sglang import SGLANG_PYTHON


def test_an_fp8_moe_native_keeps_its_input_after_another_native_imports_the_helper():
    script = Path(__file__).parent / "sglang_cpu" / "fused_experts_copies.py"
    done = subprocess.run([str(SGLANG_PYTHON), str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["ok", "2"]
