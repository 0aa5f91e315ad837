"""What an op family is, as data: the one key that names it (hook op, recorder, replay), the
Definition op types it owns, its template Definitions, its PyTorch baselines and the engines'
native kernels, how its outputs are checked, and which kernel an engine runs for it.

How a family's calls become Definitions (and how the engines' layers become calls) is code, in
the family's own package beside this description; see :mod:`fi_profile.families`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from fi_profile.schema.definition import Definition

#: a sibling file of a native Solution that is the family's PyTorch baseline as fitted to the Definition
FITTED_BASELINE = "<fitted baseline>"


@dataclass(frozen=True)
class Baseline:
    """A PyTorch source of the family's package (``file``) that serves every shape of its op: it fits
    a Definition whose inputs are its ``run``'s parameters (and whose outputs its ``OUTPUTS`` names,
    where it names them); ``constants``: the assignments at its top set from the Definition (its
    reference's constants, or its const axes), all of which the Definition must give."""

    file: str
    constants: tuple[str, ...] = ()
    #: assignments at its top set from the Definition where it gives them; where it does not, the
    #: source's own values are the plain op's (an attention variant's window and soft cap): the
    #: Definitions of a variant must each give them
    optional_constants: tuple[str, ...] = ()
    #: also run under torch.compile (not for a ``run`` that loops in Python over data-dependent
    #: values: Dynamo would specialize on them and compile again for every workload)
    compiled: bool = True
    #: only for Definitions of this op type (None: any of the family's)
    op_type: Optional[str] = None
    #: works in place as the engine's kernel does, on the inputs the Definition's ``overwrites`` names
    in_place: bool = False


@dataclass(frozen=True)
class Native:
    """An engine library's own kernel as a Solution (``file`` of the family's package), used where
    ``library`` (and ``requires``, a compiled module of it) imports, on CUDA."""

    library: str
    file: str
    #: assignments at the source's top set from the Definition where it gives them
    constants: tuple[str, ...] = ()
    #: other files of the Solution, which ``file`` imports: path -> file of the family's package, or
    #: :data:`FITTED_BASELINE`
    siblings: Mapping[str, str] = field(default_factory=dict)
    #: compiled modules of it, any of which it needs (a kernel library's name differs by version)
    requires: Union[str, tuple[str, ...], None] = None
    #: the inputs the kernel works in place on (``spec.overwrites``), from the Definition
    overwrites: Optional[Callable[[Definition], Mapping[str, Optional[str]]]] = None
    #: offered only where the Definition fits ``file``'s ``run`` as a :class:`Baseline` would
    must_fit: bool = False
    #: its Solution's label where the library has several kernels for one Definition (else ``library``)
    label: Optional[str] = None
    #: the Definition's outputs it computes, where not all (``spec.computes``; None: all)
    computes: Optional[tuple[str, ...]] = None


@dataclass(frozen=True)
class EngineKernel:
    """Which replayed solution is the kernel an engine ran: its label (None: the replay has none)."""

    label: Optional[str]
    what: str  # what the engine ran, in words


@dataclass(frozen=True)
class EngineRun:
    """How an engine ran a Definition's calls, as its capture record says."""

    framework: str  # "vLLM", "SGLang"
    execution: str  # "eager", "compiled", "cuda_graph" (joined with " and " when several)
    attention_backend: str
    #: the kernels the capture's accounting attributed to the Definition's calls (``run.engine_kernels``;
    #: empty where it did not run or attributed none), by name
    kernels: tuple[str, ...] = ()

    def launched(self, name: str) -> Optional[bool]:
        """Whether the accounting saw a kernel of this name among them (None: it says nothing)."""
        word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")
        return any(word.search(k) for k in self.kernels) if self.kernels else None


def no_natives(definition: Definition, fitted: Optional[str]) -> Sequence[Native]:
    return ()


def no_flops(definition: Definition, axes: Mapping[str, int]) -> Optional[float]:
    return None


def matmul_flops(definition: Definition, axes: Mapping[str, int]) -> Optional[float]:
    """2 M N K (times ``batch`` where the Definition has one): a GEMM's multiply-adds."""
    return 2.0 * axes.get("batch", 1) * axes["M"] * axes["N"] * axes["K"]


def no_outputs(definition: Definition) -> tuple[str, ...]:
    return ()


def no_rounding(definition: Definition) -> None:
    return None


def no_scaling(definition: Definition) -> Mapping[str, str]:
    return {}


def unknown_engine_kernel(run: EngineRun, definition: Definition) -> Optional[EngineKernel]:
    return None


def no_input_values(name: str, shape: tuple[int, ...], definition: Definition, gen: Any, device: Any,
                    dtype: Any) -> Optional[Any]:
    return None


@dataclass(frozen=True)
class Family:
    key: str
    #: the package holding the family's sources (its own ``__name__``)
    package: str
    #: the Definition op types it owns (``definitions/{op_type}/``, ``workloads/{op_type}/``)
    op_types: tuple[str, ...]
    #: shipped Definitions its captured calls are instantiated from
    templates: tuple[str, ...] = ()
    #: tried in order (one that names its outputs before the one it refines)
    baselines: tuple[Baseline, ...] = ()
    #: (Definition, the file of the baseline that fits it or None) -> the native kernels that compute it
    natives: Callable[[Definition, Optional[str]], Sequence[Native]] = no_natives
    #: how outputs are judged against the reference: "elementwise" (allclose per dtype) or
    #: "distribution" (random outputs: their empirical distributions)
    check: str = "elementwise"
    #: its outputs are sums of rounded terms larger than themselves (a MoE layer's experts, an FP8
    #: GEMM's products): the elementwise check's atol is taken relative to the reference output's
    #: largest magnitude; True for all its op types, the op types it applies to, or a test of the Definition
    atol_of_largest: Union[bool, tuple[str, ...], Callable[[Definition], bool]] = False

    #: the narrower format the engines' kernels round an intermediate of a Definition's computation
    #: to, where its reference keeps it exact (an FP8 MoE quantizes its activations again between
    #: its two GEMMs): its check's atol is that format's precision (:func:`fi_profile.replay.check.compare`)
    rounds_through: Callable[[Definition], Optional[Any]] = no_rounding
    #: output -> another output whose largest magnitude scales its ``atol_of_largest`` too, where
    #: larger than its own: a chunked recurrence reads its output from chunk-start states rounded
    #: to the activations' dtype (Gated DeltaNet's ``o = q h``), so its rounding is the state's
    atol_scaled_by: Callable[[Definition], Mapping[str, str]] = no_scaling

    #: the Definition's outputs whose rows are sets, in any order (a top-k's indices): compared as
    #: multisets per row (:func:`fi_profile.replay.check.compare_sets`)
    unordered_rows: Callable[[Definition], tuple[str, ...]] = no_outputs
    #: the inputs whose values are slots of a recurrent state cache (the inputs whose leading axis
    #: is ``state_cache_size``; -1 skips a request): a replay renumbers the slots a workload uses and
    #: sizes the cache to them (:func:`fi_profile.workload_inputs.compact_slots`)
    slot_inputs: tuple[str, ...] = ()

    def checks_atol_of_largest(self, definition: Definition) -> bool:
        if callable(self.atol_of_largest):
            return bool(self.atol_of_largest(definition))
        return self.atol_of_largest is True or (isinstance(self.atol_of_largest, tuple)
                                                and definition.op_type in self.atol_of_largest)
    #: the kernel the engine ran for a Definition of the family, or None where unknown
    engine_kernel: Callable[[EngineRun, Definition], Optional[EngineKernel]] = unknown_engine_kernel
    #: the words the engines' kernels of the family are named with, as the profiler reports them
    #: (cuBLAS's ``nvjet_*``, Inductor's ``triton_red_fused_add_rms_norm_0``, vLLM's
    #: ``reshape_and_cache_flash_kernel``): a kernel of a compiled forward or a CUDA graph is
    #: matched to the graph's calls by them (:mod:`fi_profile.capture.kernel_accounting`). A word
    #: of 4 letters or more also matches inside a name (``ApplyRotaryPosIds``), a shorter one only
    #: as a word of it (``aten::mm``)
    kernel_words: tuple[str, ...] = ()
    #: op type -> its kernels' words, where they are not ``kernel_words`` (an FP8 linear layer's
    #: activation quantization beside its GEMM)
    op_kernel_words: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: words of a kernel named after no family that ends the family's call with its final reduction
    #: (SGLang's fused MoE sums its top-k outputs in an Inductor kernel, ``triton_per_fused_copy__mul_sum_0``):
    #: fitted only to unnamed kernels right after the call's own, never to find a call
    tail_words: tuple[str, ...] = ()
    #: the same for a kernel that begins the family's call (cuBLAS's split-K GEMMs clear their
    #: workspace first: ``Memset (Device)``), fitted only to unnamed kernels right before the call's own
    head_words: tuple[str, ...] = ()
    #: words of the family's kernels that only finish the kernel before them on their stream (cuBLAS's
    #: split-K reduction, ``splitKreduce_kernel``): such a kernel stays with that kernel's call, even
    #: where the next call is of the family too (a MoE's router GEMM, then its shared experts' GEMM)
    continue_words: tuple[str, ...] = ()
    #: keys of other families whose kind of kernel the family's own calls launch inside them (a fused
    #: MoE runs its SwiGLU between its two expert GEMMs): a graph's kernel named after one of those
    #: may go to a call of this family. A kernel named after another family never goes to a call of
    #: this one otherwise (an unhooked attention layer's kernel is never a neighbouring GEMM's)
    launches: tuple[str, ...] = ()
    #: every call of the family reduces (a norm): Inductor's pointwise kernels (``triton_poi_*``)
    #: alone never compute one
    reduces: bool = False
    #: (Definition, a workload's axis values, constants included) -> the floating-point operations
    #: one call does (None: not compute-bound work, or not known from the axes alone)
    flops: Callable[[Definition, Mapping[str, int]], Optional[float]] = no_flops
    #: why the replay runs none of its Definitions (a collective among GPUs), where it runs none
    not_replayed: Optional[str] = None
    #: (input name, shape, Definition, generator, device, dtype) -> the values of a synthesized input
    #: whose range the op depends on (a recurrence's gates), or None for the generic values of
    #: :mod:`fi_profile.synthesis.values`
    input_values: Callable[..., Optional[Any]] = no_input_values
