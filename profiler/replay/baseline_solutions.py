"""The shipped baseline Solutions for a Definition (``--solutions baselines``).

A family's source (``profiler/replay/baselines/*.py``) fits a Definition when the Definition's
inputs are parameters of its ``run`` and every parameter without a default is an input. Its
``NAME = value`` constants are set from the Definition's reference (``EPS``, RoPE parameters) or
const axes (``top_k``), so one source serves every shape of an op.
"""

from __future__ import annotations

import ast
import re
from importlib import resources
from typing import Optional

from fi_profile.schema.definition import Definition
from fi_profile.schema.reference import entry_signature, reference_constant
from fi_profile.schema.solution import Solution

#: family source -> the reference constants and const axes it takes from the Definition
FAMILIES: dict[str, tuple[str, ...]] = {
    "fused_add_rmsnorm": ("EPS",),
    "rmsnorm": ("EPS",),
    "qk_rmsnorm": ("EPS",),
    "silu_and_mul": (),
    "gemm": (),
    "embedding": (),
    "rope": ("ROPE_THETA", "FACTOR", "LOW_FREQ_FACTOR", "HIGH_FREQ_FACTOR", "ORIGINAL_MAX_POSITION"),
    "paged_attention": (),
    "ragged_attention": (),
    "sampling": (),
    "moe": ("top_k", "RENORMALIZE"),
}
#: families whose ``run`` loops in Python over data-dependent values (requests, experts): under
#: torch.compile Dynamo would specialize on them and compile again for every workload (and, past
#: its recompile limit, silently run them eagerly), so they get no ``torch_compile`` baseline
NOT_COMPILED = frozenset({"paged_attention", "ragged_attention", "moe"})
#: op types a family may serve (input names alone would let a GEMM family take any (A, B) op)
OP_TYPES: dict[str, tuple[str, ...]] = {
    "fused_add_rmsnorm": ("rmsnorm",),
    "rmsnorm": ("rmsnorm",),
    "qk_rmsnorm": ("qk_rmsnorm",),
    "silu_and_mul": ("activation",),
    "gemm": ("gemm",),
    "embedding": ("embedding",),
    "rope": ("rope",),
    "paged_attention": ("gqa_paged",),
    "ragged_attention": ("gqa_ragged",),
    "sampling": ("sampling",),
    "moe": ("moe",),
}


def family_source(family: str) -> str:
    return (resources.files("fi_profile.replay.baselines") / f"{family}.py").read_text()


def _fits(definition: Definition, source: str) -> bool:
    """The Definition's inputs are ``run``'s parameters (the required ones at least), and its outputs
    those the source's ``OUTPUTS`` names, where it names them (families are tried in order, so a
    family that names them comes before the one it refines)."""
    signature = entry_signature(source, "run")
    outputs = _declared_outputs(source)
    if outputs is not None and tuple(definition.outputs) != outputs:
        return False
    return set(signature.required) <= set(definition.inputs) <= set(signature.params)


def _declared_outputs(source: str) -> Optional[tuple[str, ...]]:
    """A family's ``OUTPUTS = (...)``, or None where it returns the Definition's one output."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "OUTPUTS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return None


def _constant(definition: Definition, name: str) -> Optional[str]:
    if name in definition.const_axes:
        return repr(definition.const_axes[name])
    return reference_constant(definition.reference, name)


def torch_source(definition: Definition) -> Optional[str]:
    """The family source fitted to ``definition``, or None when no family fits."""
    fitted = torch_family(definition)
    return None if fitted is None else fitted[1]


def torch_family(definition: Definition) -> Optional[tuple[str, str]]:
    """The family fitted to ``definition`` and its source, or None when no family fits."""
    for family, constants in FAMILIES.items():
        if definition.op_type not in OP_TYPES[family]:
            continue
        source = family_source(family)
        if not _fits(definition, source):
            continue
        for name in constants:
            value = _constant(definition, name)
            if value is None:
                break  # the family's defaults would be a different op: not this family
            source = re.sub(rf"^{re.escape(name)} = .*$", f"{name} = {value}", source, count=1, flags=re.M)
        else:
            return family, source
    return None


def baseline_solutions(definition: Definition) -> list[Solution]:
    fitted = torch_family(definition)
    solutions = []
    if fitted is not None:
        family, source = fitted
        languages = ("python",) if family in NOT_COMPILED else ("python", "torch_compile")
        for language in languages:
            label = "torch" if language == "python" else "torch_compile"
            solutions.append(_solution(definition, label, language, source, "PyTorch baseline shipped with fi-profile"))
    solutions += native_solutions(definition)
    return solutions


def _solution(definition: Definition, label: str, language: str, source: str, description: str,
              siblings: Optional[dict[str, str]] = None, overwrites: Optional[dict[str, Optional[str]]] = None) -> Solution:
    """``source`` as ``main.py``; ``siblings``: other files of the Solution, which it imports;
    ``overwrites``: the inputs it works in place on."""
    sources = [{"path": "main.py", "content": source}] + [{"path": p, "content": c} for p, c in (siblings or {}).items()]
    spec = {"language": language, "target_hardware": [], "entry_point": "main.py::run"}
    if overwrites:
        spec["overwrites"] = overwrites
    return Solution.model_validate(
        {
            "name": f"{definition.name}__{label}",
            "definition": definition.name,
            "description": description,
            "author": "fi-profile",
            "spec": spec,
            "sources": sources,
        }
    )


_NATIVE: dict[str, dict[str, str]] = {
    # the kernels vLLM calls (torch.ops._C), destination-passing underneath
    "vllm": {
        "rmsnorm": (
            "import torch\nimport vllm._custom_ops  # registers torch.ops._C\n\nEPS = {EPS}\n\n\n"
            "def run(hidden_states, weight):\n    out = torch.empty_like(hidden_states)\n"
            "    torch.ops._C.rms_norm(out, hidden_states, weight, EPS)\n    return out\n"
        ),
        "fused_add_rmsnorm": (  # in place on both (spec.overwrites): replay hands it fresh copies, untimed
            "import torch\nimport vllm._custom_ops  # registers torch.ops._C\n\nEPS = {EPS}\n\n\n"
            "def run(hidden_states, residual, weight):\n"
            "    torch.ops._C.fused_add_rms_norm(hidden_states, residual, weight, EPS)\n"
        ),
        "silu_and_mul": (
            "import torch\nimport vllm._custom_ops  # registers torch.ops._C\n\n\n"
            "def run(input):\n"
            "    out = torch.empty(input.shape[:-1] + (input.shape[-1] // 2,), dtype=input.dtype, device=input.device)\n"
            "    torch.ops._C.silu_and_mul(out, input)\n    return out\n"
        ),
        "rope": "file:vllm_rope",
        "moe": "file:vllm_moe",
    },
    "flashinfer": {
        "rmsnorm": (
            "import flashinfer\n\nEPS = {EPS}\n\n\ndef run(hidden_states, weight):\n"
            "    return flashinfer.norm.rmsnorm(hidden_states, weight, eps=EPS)\n"
        ),
        "fused_add_rmsnorm": (  # in place on both, as vLLM's
            "import flashinfer\n\nEPS = {EPS}\n\n\ndef run(hidden_states, residual, weight):\n"
            "    flashinfer.norm.fused_add_rmsnorm(hidden_states, residual, weight, eps=EPS)\n"
        ),
        "silu_and_mul": "import flashinfer\n\n\ndef run(input):\n    return flashinfer.activation.silu_and_mul(input)\n",
        "paged_attention": "file:flashinfer_paged_attention",
        "ragged_attention": "file:flashinfer_ragged_attention",
        "rope": "file:flashinfer_rope",
        "sampling": "file:flashinfer_sampling",
    },
}


#: kind -> the inputs its native kernels overwrite (vLLM's and FlashInfer's fused add + RMSNorm write
#: the output into hidden_states and the new residual into residual; a Definition without that
#: output leaves the residual as scratch)
_NATIVE_OVERWRITES = {
    "fused_add_rmsnorm": lambda d: d.overwrites or {"hidden_states": "output",
                                                   "residual": "residual_out" if "residual_out" in d.outputs else None},
}

#: (library, kind) -> the compiled module the kernel lives in, when not the library's main one
_NATIVE_MODULES = {("vllm", "moe"): "vllm._moe_C"}


def _native_kind(definition: Definition) -> Optional[str]:
    if definition.op_type == "gqa_paged" and _fits(definition, family_source("flashinfer_paged_attention")):
        return "paged_attention"
    if definition.op_type == "gqa_ragged" and _fits(definition, family_source("flashinfer_ragged_attention")):
        return "ragged_attention"
    if definition.op_type == "rmsnorm":
        return "fused_add_rmsnorm" if "residual" in definition.inputs else "rmsnorm"
    if definition.op_type == "rope" and "neox" in definition.name and torch_source(definition) is not None:
        return "rope"
    if definition.op_type == "sampling" and _fits(definition, family_source("flashinfer_sampling")):
        return "sampling"
    if definition.op_type == "activation" and definition.name.startswith("silu_and_mul"):
        return "silu_and_mul"
    if definition.op_type == "moe" and torch_source(definition) is not None:  # softmax top-k routing
        return "moe"
    return None


def _native_source(definition: Definition, kind: str, source: str) -> tuple[str, dict[str, str]]:
    """The native baseline's ``main.py`` and the sibling files it imports."""
    if not source.startswith("file:"):
        return source.replace("{EPS}", _constant(definition, "EPS") or "1e-6"), {}
    source = family_source(source[len("file:") :])
    siblings: dict[str, str] = {}
    if kind == "rope":  # the cos/sin cache from the torch family's inverse frequencies, its constants set
        rope = torch_source(definition)
        assert rope is not None
        siblings = {"rope.py": rope, "rope_cos_sin.py": family_source("rope_cos_sin")}
    for name in FAMILIES.get(kind, ()):  # the same constants as the torch family (top_k, RENORMALIZE)
        source = re.sub(rf"^{re.escape(name)} = .*$", f"{name} = {_constant(definition, name)}", source, count=1, flags=re.M)
    return source, siblings


def native_solutions(definition: Definition) -> list[Solution]:
    """vLLM / FlashInfer kernels for this Definition, when the library imports here (CUDA only)."""
    import importlib.util

    import torch

    kind = _native_kind(definition)
    if kind is None or not torch.cuda.is_available():
        return []
    found = []
    for library, sources in _NATIVE.items():
        if kind not in sources or importlib.util.find_spec(library) is None:
            continue
        module = _NATIVE_MODULES.get((library, kind))
        if module is not None and importlib.util.find_spec(module) is None:
            continue  # e.g. a vLLM build without its MoE kernels
        source, siblings = _native_source(definition, kind, sources[kind])
        found.append(_solution(definition, library, "python", source, f"{library}'s kernel, as the engine calls it", siblings,
                               _NATIVE_OVERWRITES.get(kind, lambda d: None)(definition)))
    return found
