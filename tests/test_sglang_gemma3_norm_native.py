"""SGLang's ``Gemma3RMSNorm`` runs as PyTorch code on CUDA (its ``forward_native``): the replay's
native of it imports SGLang's own class and computes the ``gemma_rmsnorm_*`` Definition, run here
in the SGLang venv on CPU (the replay runs natives on CUDA only), on bf16 rows of Gemma-3-27B's
width, one layer made per weight."""

from __future__ import annotations

import subprocess
from pathlib import Path

from test_capture_sglang import SGLANG_PYTHON


def test_sglangs_gemma3_norm_native_computes_the_gemma_rmsnorm_definition():
    script = Path(__file__).parent / "sglang_cpu" / "gemma3_norm_native.py"
    done = subprocess.run([str(SGLANG_PYTHON), str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["ok", "1e-06", "3"]
