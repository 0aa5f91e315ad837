"""Turn a Solution into a callable: its sources written to a cache folder named by their content
hash, then imported (Python, Triton, torch.compile) or compiled with ``load_inline`` (CUDA/C++).

Triton needs real files (it reads kernel source with ``inspect``), hence a folder per solution.
A build failure raises :class:`BuildError` with the compiler's or the importer's message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fi_profile.schema.solution import Language, Solution


class BuildError(Exception):
    pass


@dataclass(frozen=True)
class Built:
    fn: Callable[..., Any]
    #: Python entry points take inputs by name; compiled C++/CUDA ones positionally, in order
    by_name: bool


def cache_root() -> Path:
    return Path(os.environ.get("FI_PROFILE_CACHE", Path.home() / ".cache" / "fi-profile")) / "solutions"


def content_hash(solution: Solution) -> str:
    data = solution.spec.model_dump_json() + "".join(f"\0{s.path}\0{s.content}" for s in solution.sources)
    return hashlib.sha256(data.encode()).hexdigest()[:20]


def materialize(solution: Solution) -> Path:
    folder = cache_root() / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', solution.name)[:60]}-{content_hash(solution)}"
    for source in solution.sources:
        path = folder / source.path
        if not path.is_file() or path.read_text() != source.content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source.content)
    return folder


def build(solution: Solution) -> Built:
    folder = materialize(solution)
    if solution.spec.language is Language.cuda:
        return Built(_build_extension(solution, folder), by_name=False)
    fn = _import_entry(solution, folder)
    if solution.spec.language is Language.torch_compile:
        import torch

        # compiled afresh in each process, for the shapes of its first call (evaluate's compile
        # workload): Inductor's FX graph cache ignores a dynamic dimension's size hint, so a graph
        # compiled for a few tokens (another replay's, another process's) would serve every shape
        # with block sizes chosen for those few (benchmarks/inductor_first_call.py: SwiGLU 2.4x
        # slower on 16k tokens, H100)
        fn = torch.compile(fn, options={"fx_graph_cache": False})
    return Built(fn, by_name=True)


def _import_entry(solution: Solution, folder: Path) -> Callable[..., Any]:
    module_name = f"fi_solution_{content_hash(solution)}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, folder / solution.spec.entry_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(folder))  # multi-file solutions import their siblings
        before = set(sys.modules)
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # a solution may raise anything at import, SystemExit included
            raise BuildError(_short_traceback(exc)) from None
        finally:
            sys.path.remove(str(folder))
            _forget_siblings(before, folder)
        sys.modules[module_name] = module
    fn = getattr(module, solution.spec.entry_function, None)
    if not callable(fn):
        raise BuildError(f"{solution.spec.entry_file} defines no callable {solution.spec.entry_function!r}")
    return fn


def _forget_siblings(before: set[str], folder: Path) -> None:
    """Drop the modules a solution imported from its own folder from ``sys.modules``: another
    solution's ``utils.py`` (or ``rope.py`` with other constants) must not be handed this one."""
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if file and Path(file).resolve().is_relative_to(folder.resolve()):
            del sys.modules[name]


_DEFINITION = r"^[ \t]*((?:[\w:<>,]+[ \t*&]+)+){name}[ \t]*\(([^)]*)\)[ \t\n]*\{{"


def _build_extension(solution: Solution, folder: Path) -> Callable[..., Any]:
    """C++/CUDA sources through ``torch.utils.cpp_extension.load_inline``; the entry function gets
    a pybind binding (its declaration is read from its definition when no header declares it)."""
    from torch.utils import cpp_extension

    name = solution.spec.entry_function
    cuda = [s.content for s in solution.sources if s.path.endswith((".cu", ".cuh"))]
    cpp = [s.content for s in solution.sources if s.path.endswith((".cpp", ".cc", ".h", ".hpp"))]
    entry = solution.source(solution.spec.entry_file)
    assert entry is not None
    if entry.path.endswith((".cu", ".cuh")):
        found = re.search(_DEFINITION.format(name=re.escape(name)), entry.content, flags=re.M)
        if found is None:
            raise BuildError(f"{entry.path}: no definition of {name}(...) found to bind")
        cpp.append(f"{found.group(1).strip()} {name}({found.group(2)});")
    try:
        module = cpp_extension.load_inline(
            name=f"fi_solution_{content_hash(solution)}",
            cpp_sources=cpp,
            cuda_sources=cuda or None,
            functions=[name],
            build_directory=str(_build_dir(folder)),
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"] if cuda else None,
            verbose=False,
        )
    except BaseException as exc:  # compiler errors arrive as RuntimeError with the build log
        raise BuildError(_short_traceback(exc)) from None
    return getattr(module, name)


def _build_dir(folder: Path) -> Path:
    path = folder / "build"
    path.mkdir(exist_ok=True)
    return path


def _short_traceback(exc: BaseException, limit: int = 6000) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[-limit:]
