"""Solution: a candidate implementation of a Definition (seed-001 code schema, flashinfer layout).

The entry point is ``file.py::function``. It is called with the Definition's inputs by name and
either returns the outputs (like a reference) or, destination-passing, also receives the
pre-allocated outputs by name and returns nothing. Which of the two is read from its signature
unless ``spec.destination_passing`` says so.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import PurePosixPath
from typing import Annotated, Any, Optional

from pydantic import BeforeValidator, Field, field_validator, model_validator

from fi_profile.errors import FieldErrors, Loc
from fi_profile.schema.base import StrictModel
from fi_profile.schema.reference import EntrySignature, entry_signature

_ENTRY_POINT = re.compile(r"^(?P<file>[^:]+)::(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")


class Language(str, Enum):
    python = "python"
    triton = "triton"
    cuda = "cuda"
    torch_compile = "torch_compile"

    @property
    def entry_is_python(self) -> bool:
        return self is not Language.cuda


def _lower(value: Any) -> Any:
    # flashinfer's docs write "Triton" and "CUDA"; its examples write "triton".
    return value.lower() if isinstance(value, str) else value


class SourceFile(StrictModel):
    path: str = Field(min_length=1)
    content: str

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        p = PurePosixPath(path)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError("must be a relative path inside the solution")
        return path


class SolutionSpec(StrictModel):
    """flashinfer-bench's spec fields are read as well: ``destination_passing_style`` (its name
    for ``destination_passing``) and ``binding`` (C++/CUDA: tvm-ffi or torch). A Python entry
    that fi-profile compiles with torch.compile is written in its form as ``language: python``
    with ``torch_compile: true`` (its languages have no torch_compile)."""

    language: Annotated[Language, BeforeValidator(_lower)]
    target_hardware: list[str] = Field(default_factory=list)
    dependencies: list[str] = Field(default_factory=list)
    entry_point: str
    destination_passing: Optional[bool] = None
    #: the inputs the call writes into (as the engines' in-place kernels do), each with the output
    #: it holds afterwards, or null (scratch). Replay gives the call fresh copies of them, made
    #: before each call outside the timed region, and checks the outputs they hold.
    overwrites: Optional[dict[str, Optional[str]]] = None
    #: the Definition's outputs the call computes, where it computes only some of them (an engine's
    #: attention kernel that returns no log-sum-exp): only these are checked, the result names the
    #: others (``check.unchecked``), and such a Solution is never a projection's best candidate
    computes: Optional[list[str]] = Field(default=None, min_length=1)
    binding: Optional[str] = None

    @model_validator(mode="before")
    @classmethod
    def _flashinfer_bench_form(cls, spec: Any) -> Any:
        if not isinstance(spec, dict):
            return spec
        spec = dict(spec)
        if "destination_passing_style" in spec:
            style = spec.pop("destination_passing_style")
            if spec.get("destination_passing") is not None and spec["destination_passing"] != style:
                raise ValueError("destination_passing and destination_passing_style disagree")
            spec["destination_passing"] = style
        if spec.pop("torch_compile", False) is True:
            if _lower(spec.get("language")) != Language.python.value:
                raise ValueError("torch_compile: true is for a python entry point")
            spec["language"] = Language.torch_compile.value
        return spec

    @field_validator("entry_point")
    @classmethod
    def _entry_format(cls, entry: str) -> str:
        if not _ENTRY_POINT.match(entry):
            raise ValueError("must be 'file_path::function_name', e.g. 'main.py::run'")
        return entry

    @property
    def entry_file(self) -> str:
        return self.entry_point.split("::", 1)[0]

    @property
    def entry_function(self) -> str:
        return self.entry_point.split("::", 1)[1]


class Solution(StrictModel):
    name: str = Field(min_length=1)
    definition: str = Field(min_length=1)
    description: Optional[str] = None
    author: str = Field(min_length=1)
    spec: SolutionSpec
    sources: list[SourceFile] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_sources(self) -> "Solution":
        errors: list[tuple[Loc, str]] = []
        seen: set[str] = set()
        for i, source in enumerate(self.sources):
            if source.path in seen:
                errors.append((("sources", i, "path"), f"duplicate path {source.path!r}"))
            seen.add(source.path)
        entry = self.source(self.spec.entry_file)
        if entry is None:
            errors.append((("spec", "entry_point"), f"no source file {self.spec.entry_file!r}"))
        elif self.spec.language.entry_is_python:
            try:
                entry_signature(entry.content, self.spec.entry_function)
            except ValueError as exc:
                errors.append((("spec", "entry_point"), f"{self.spec.entry_file} {exc}"))
        if errors:
            raise FieldErrors(errors)
        return self

    def source(self, path: str) -> Optional[SourceFile]:
        return next((s for s in self.sources if s.path == path), None)

    def entry_signature(self) -> EntrySignature:
        entry = self.source(self.spec.entry_file)
        assert entry is not None
        return entry_signature(entry.content, self.spec.entry_function)

    def is_destination_passing(self, inputs: list[str], outputs: list[str]) -> bool:
        """Whether ``run`` takes the outputs too; explicit in the spec or read from the signature."""
        if self.spec.destination_passing is not None:
            return self.spec.destination_passing
        signature = self.entry_signature()
        return bool(outputs) and set(outputs) <= set(signature.params)

    def problems_with(self, definition: Any) -> list[tuple[Loc, str]]:
        """What this Solution says that its Definition contradicts (field path, message)."""
        problems = overwrite_problems(self.spec.overwrites, definition, ("spec", "overwrites"))
        for i, name in enumerate(self.spec.computes or ()):
            if name not in definition.outputs:
                problems.append((("spec", "computes", i),
                                 f"{name!r} is not an output of {definition.name} ({', '.join(definition.outputs)})"))
        return problems


def overwrite_problems(overwrites: Optional[dict[str, Optional[str]]], definition: Any,
                       at: Loc) -> list[tuple[Loc, str]]:
    """An ``overwrites`` map checked against a Definition: inputs it writes, outputs they hold,
    each output held by one input at most."""
    problems: list[tuple[Loc, str]] = []
    held: dict[str, str] = {}
    inputs, outputs = ", ".join(definition.inputs), ", ".join(definition.outputs)
    for source, output in (overwrites or {}).items():
        if source not in definition.inputs:
            problems.append(((*at, source), f"{source!r} is not an input of {definition.name} ({inputs})"))
        if output is None:
            continue
        if output not in definition.outputs:
            problems.append(((*at, source), f"{output!r} is not an output of {definition.name} ({outputs})"))
        elif output in held:
            problems.append(((*at, source), f"{output!r} is held by {held[output]!r} already"))
        else:
            held[output] = source
        if source in definition.inputs and output in definition.outputs:
            a, b = definition.inputs[source], definition.outputs[output]
            if (a.shape, a.dtype) != (b.shape, b.dtype):
                problems.append(((*at, source), f"{source} {a.dtype}{a.shape} cannot hold {output} {b.dtype}{b.shape}"))
    return problems
