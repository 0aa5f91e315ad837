#!/usr/bin/env bash
# Test-only: a CPU SGLang 0.5.23 venv with fi-profile installed (its plugin entry point included).
# SGLang's plain install pulls CUDA torch and fails on CPU, so: --no-deps plus the requirements
# the engine really imports, a stub sgl_kernel (raises if called; its Gated DeltaNet ops in PyTorch)
# and the torchvision op-schema shim. Recipe from ../shared/sglang-cpu (seen working 2026-11-26). Usage: bash setup.sh VENV
set -euo pipefail
V=${1:?venv dir}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
python3 -m venv "$V"
"$V/bin/pip" install -q sglang==0.5.23 --no-deps
"$V/bin/pip" install -q -c "$HERE/constraints.txt" -r "$HERE/requirements.txt" xgrammar==0.2.7
"$V/bin/pip" install -q --no-deps torchvision==0.28.0
SP=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp "$HERE/torchvision_op_shim.py" "$SP/"
echo "import torchvision_op_shim" > "$SP/torchvision_op_shim.pth"
mkdir -p "$SP/sgl_kernel" && cp "$HERE/sgl_kernel_stub.py" "$SP/sgl_kernel/__init__.py"
# sgl-kernel's Gated DeltaNet CPU ops in PyTorch, and CPU paths of two Triton launches (Qwen3-Next)
cp "$HERE/sgl_kernel_mamba.py" "$SP/sgl_kernel/mamba.py"
cp "$HERE/cpu_paths.py" "$SP/sglang_cpu_paths.py"
echo "import sglang_cpu_paths" > "$SP/sglang_cpu_paths.pth"
"$V/bin/pip" install -q -e "$REPO"
"$V/bin/python" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
