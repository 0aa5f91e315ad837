"""One (workload × solution) evaluation, run inside a worker process: build, check on several
draws of the inputs, time, re-check the last timed output.

The reference itself is evaluated the same way (``solution=None``): its time is what speedups
are measured against. What it would repeat is left out: it has just run on the first draw (that
draw's expected outputs are its own), so it has no separate first call, and it is checked on that
draw alone (shape, dtype, inputs left unchanged, the same output again), not against itself on
every draw; its timed loop may stop after :data:`REFERENCE_MIN_REPS` calls. It runs under
``torch.inference_mode`` (it is plain PyTorch, and a Python loop's time goes to the dispatcher,
which then skips autograd's and the version counters' work). A Python reference of thousands of
kernels a call (paged attention's loop over the requests) took half of a replay's time before
(issue 44).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

from fi_profile.entry_points import load_function, outputs_by_name, run_reference
from fi_profile.families import family_of
from fi_profile.replay.build import BuildError, Built, build, content_hash
from fi_profile.replay.check import Diff, compare, compare_sets, distribution_distance, largest_magnitude
from fi_profile.replay.stopping import StoppingRule
from fi_profile.replay.timing import measure
from fi_profile.schema.definition import Definition
from fi_profile.schema.solution import Language, Solution
from fi_profile.schema.workload import Workload
from fi_profile.workload_inputs import workload_inputs

SAMPLING_DRAWS = 256
#: the fewest timed calls of the reference (a solution's: :class:`StoppingRule`'s ``min_reps``); its
#: time is the speedups' denominator, not projected onto the engine, and a call of a Python reference
#: takes milliseconds, so its median settles on few
REFERENCE_MIN_REPS = 4
#: untimed calls before the timed loop (the reference's: the fewest that give its enqueue time)
WARMUP_CALLS, REFERENCE_WARMUP_CALLS = 3, 2
SAMPLING_MAX_DISTANCE = 0.5  # coarse: two sets of 256 draws over up to 64 tokens differ by ~0.3


@dataclass
class Task:
    definition: dict
    workload: dict
    root: str
    solution: Optional[dict]  # None: the Definition's reference
    device: str = "cpu"
    draws: int = 3
    #: the timed loop's stopping rule (:class:`~fi_profile.replay.stopping.StoppingRule`)
    min_time_s: float = 0.0
    max_time_s: float = 0.1
    precision: float = 0.01
    cuda_graph: bool = False
    #: CUDA events around each call, or the call's own kernels' durations (:data:`~fi_profile.replay.timing.TIMERS`)
    timer: str = "kernels"
    #: the call's per-step inputs read back into the L2 after each flush (:func:`per_step_inputs`)
    warm_inputs: bool = False
    #: build and call once, untimed and unchecked (a warm-up of the on-disk caches: replay/prewarm.py)
    warm_only: bool = False
    #: a ``torch.compile``'d solution's first call in a process is on this workload (its Definition's
    #: largest): Inductor sizes and autotunes its kernels for the shapes it is first called with, and
    #: an engine compiles at its largest batch (vLLM's profile run of max_num_batched_tokens tokens)
    compile_workload: Optional[dict] = None


@dataclass
class Outcome:
    status: str
    compiled: bool = True
    error: Optional[str] = None
    check: Optional[dict] = None
    timing: Optional[dict] = None
    #: the worker's CUDA context may be broken: start a fresh worker
    restart: bool = False
    #: seconds spent in each phase of this evaluation (build, inputs, reference, check, timed calls)
    phases: dict[str, float] = field(default_factory=dict)


class Failed(Exception):
    def __init__(self, status: str, message: str, check: Optional[dict] = None) -> None:
        super().__init__(message)
        self.status, self.check = status, check


_BUILT: dict[str, Built] = {}
#: solutions (content hash) whose first call in this process was made on their compile workload
_COMPILED_FIRST: set[str] = set()
_INPUTS: dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]] = {}


def evaluate(task: Task) -> Outcome:
    definition = Definition.model_validate(task.definition)
    workload = Workload.model_validate(task.workload)
    device = torch.device(task.device)
    if device.type == "cuda":  # a solution's own allocations and launches go to the current device
        torch.cuda.set_device(device)
    phases = Phases()
    try:
        with phases("build"):
            calling = _entry(definition, task)
    except BuildError as exc:
        return Outcome("compile_error", compiled=False, error=str(exc), phases=phases.seconds)
    try:
        if task.compile_workload is not None:
            _compile_first(definition, calling, task, device, phases)
        is_reference = task.solution is None
        draws = _Draws(lambda seed: _inputs(definition, workload, Path(task.root), device, seed, phases),
                       1 if is_reference else task.draws)
        if not is_reference:  # the reference has just run on this draw: its expected outputs
            with phases("first call"):
                _first_call(definition, calling, *draws[0], device)
        if task.warm_only:
            return Outcome("passed", phases=phases.seconds)
        method = check_method(definition)
        with phases("check"):
            check = method.check(definition, calling, draws, device)
        inputs, reference = draws[0]
        call, prepare, arguments = _bound_arguments(definition, calling, inputs, reference, device)
        warm = [arguments[n] for n in per_step_inputs(definition)] if task.warm_inputs else []
        with phases("timed calls"):
            rule = StoppingRule(precision=task.precision, min_time_s=task.min_time_s,
                                max_time_s=max(task.max_time_s, task.min_time_s),
                                min_reps=REFERENCE_MIN_REPS if is_reference else StoppingRule.min_reps)
            measured = measure(call, prepare, device, rule=rule, cuda_graph=task.cuda_graph, timer=task.timer,
                               warm=warm, warmup_calls=REFERENCE_WARMUP_CALLS if is_reference else WARMUP_CALLS)
        if method.recheck_last_output:
            with phases("check"):
                last = _named(definition, measured.last_output, calling)
                diff = _diff_all(definition, last, calling.checked(reference))
            if not diff.ok:
                raise Failed(
                    "stale_output",
                    f"the last timed call's output differs from the reference (mismatch {diff.ratio:.1%}): "
                    "work escaped the timed region (a side stream?) or an output was reused",
                )
        return Outcome("passed", check=check, timing=measured.stats(), phases=phases.seconds)
    except Failed as exc:
        return Outcome(exc.status, error=str(exc), check=exc.check, phases=phases.seconds)
    except Exception as exc:  # the solution raised: a runtime error, maybe a broken CUDA context
        return Outcome("runtime_error", error=_tail(exc), restart=_cuda_broken(device), phases=phases.seconds)


class Phases:
    """Wall-clock seconds per phase of one evaluation (``with phases("check"): ...``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - began


@dataclass(frozen=True)
class Calling:
    """How to call an entry point: ``run`` by name; whether it takes the outputs
    (destination-passing); the inputs it overwrites, each with the output it holds afterwards
    (None: scratch). Overwritten inputs get fresh copies before every call, outside the timed region."""

    run: Callable[..., Any]
    destination_passing: bool
    overwrites: Mapping[str, Optional[str]] = field(default_factory=dict)
    #: input -> its dimensions marked dynamic for torch.compile when the call is bound
    dynamic: Mapping[str, list[int]] = field(default_factory=dict)
    #: the outputs it does not compute (its spec's ``computes`` leaves them out): never checked
    unchecked: frozenset[str] = frozenset()

    def returned(self, definition: Definition) -> list[str]:
        return returned_outputs(definition, self.overwrites, self.unchecked)

    def checked(self, reference: Mapping[str, Any]) -> dict[str, Any]:
        """The reference's outputs this call is checked on."""
        return {n: r for n, r in reference.items() if n not in self.unchecked}


def returned_outputs(definition: Definition, overwrites: Mapping[str, Optional[str]],
                     unchecked: frozenset[str] = frozenset()) -> list[str]:
    """The outputs a call returns or fills: those no input it overwrites holds afterwards, of
    those it computes (``unchecked``: those it does not)."""
    held = {o for o in overwrites.values() if o is not None}
    return [n for n in definition.outputs if n not in held and n not in unchecked]


def _entry(definition: Definition, task: Task) -> Calling:
    if task.solution is None:
        fn = load_function(definition.reference, "run", label=definition.name)
        return Calling(_in_inference_mode(fn), definition.reference_destination_passing)
    solution = Solution.model_validate(task.solution)
    return _solution_calling(definition, solution)


def _in_inference_mode(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called under ``torch.inference_mode``: what it returns is an inference tensor, which
    is read (compared, cloned, ``empty_like``'d) and never written outside that mode."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return run


def _solution_calling(definition: Definition, solution: Solution) -> Calling:
    overwrites = dict(solution.spec.overwrites or {})
    unchecked = frozenset(definition.outputs) - set(solution.spec.computes or definition.outputs)
    returned = returned_outputs(definition, overwrites, unchecked)
    destination_passing = (
        solution.is_destination_passing(list(definition.inputs), returned)
        if solution.spec.language.entry_is_python
        else bool(solution.spec.destination_passing)
    )
    if solution.spec.language.entry_is_python:
        _check_entry_fits(definition, solution, returned, destination_passing)
    key = content_hash(solution)
    if key not in _BUILT:
        _BUILT[key] = build(solution)
    built = _BUILT[key]
    dynamic = var_axis_dims(definition) if solution.spec.language is Language.torch_compile else {}
    if built.by_name:
        return Calling(built.fn, destination_passing, overwrites, dynamic, unchecked)
    order = list(definition.inputs) + (returned if destination_passing else [])
    return Calling(lambda **kw: built.fn(*(kw[n] for n in order)), destination_passing, overwrites, dynamic, unchecked)


def _check_entry_fits(definition: Definition, solution: Solution, returned: list[str], destination_passing: bool) -> None:
    """A Python entry point that takes neither the Definition's value-returning arguments (its
    inputs) nor its destination-passing ones (inputs, then the outputs it fills) is one line at
    build time, never a TypeError at the first call (a solution written for another Definition of
    the same name, say)."""
    signature = solution.entry_signature()
    names = list(definition.inputs) + (returned if destination_passing else [])
    if signature.accepts(names):
        return
    inputs = ", ".join(definition.inputs)
    forms = f"({inputs})" + (f" or ({inputs}, {', '.join(returned)})" if returned else "")
    raise BuildError(f"{solution.spec.entry_point} takes ({', '.join(signature.params)}); Definition "
                     f"{definition.name} expects {forms}")


def var_axis_dims(definition: Definition) -> dict[str, list[int]]:
    """Each input's var-axis dimensions. A torch.compile'd solution gets them marked dynamic, so
    Dynamo compiles once per Definition, not once per workload (token counts differ from one
    workload to the next: unmarked, every new one recompiled, and past Dynamo's recompile limit ran
    eagerly under the ``torch_compile`` label). Const axes stay static, as an engine has them."""
    var = set(definition.var_axes)
    dims = {name: [i for i, axis in enumerate(spec.shape or []) if axis in var] for name, spec in definition.inputs.items()}
    return {name: d for name, d in dims.items() if d}


def _inputs(definition: Definition, workload: Workload, root: Path, device: torch.device, seed: int, phases: Phases):
    """Inputs of one draw (captured index tensors kept, float data drawn with ``seed``) and the
    reference's outputs on them; cached for the worker's current workload (its other pairs), as
    many draws as fit a quarter of the device's memory (DeepSeek-V3's MoE draws 22 GiB of expert
    weights: one at a time)."""
    key = (f"{definition.name}/{workload.uuid}/{device}", seed)
    if key in _INPUTS:
        return _INPUTS[key]
    if len(_INPUTS) >= 8:
        _INPUTS.clear()
    with phases("inputs"):
        inputs = workload_inputs(definition, workload, root, device=device, seed=seed)
    with phases("reference"), torch.inference_mode():
        reference = run_reference(definition, inputs)
    size = _bytes(inputs) + _bytes(reference)
    budget = _cache_budget(device)
    while _INPUTS and sum(_bytes(i) + _bytes(r) for i, r in _INPUTS.values()) + size > budget:
        _INPUTS.pop(next(iter(_INPUTS)))
    if size <= budget:
        _INPUTS[key] = (inputs, reference)
    return inputs, reference


def _bytes(tensors: dict[str, Any]) -> int:
    return sum(v.numel() * v.element_size() for v in tensors.values() if isinstance(v, torch.Tensor))


def _cache_budget(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 4
    return 8 << 30


class _Draws:
    """The checks' draws of the inputs: the first one kept (it is also the one timed), the others
    made as the check reaches them, so that at most two sets of inputs are held at once."""

    def __init__(self, make: Callable[[int], Any], count: int) -> None:
        self._make, self._count = make, count
        self._first = make(0)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> Any:
        if index != 0:
            raise IndexError("only the first draw is kept")
        return self._first

    def __iter__(self) -> Any:
        yield self._first
        for seed in range(1, self._count):
            yield self._make(seed)


def _outputs(names: list[str], device: torch.device, like: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: torch.empty_like(like[name], device=device) for name in names}


def _poison(outputs: dict[str, torch.Tensor]) -> None:
    for tensor in outputs.values():
        if tensor.dtype.is_floating_point:
            tensor.fill_(float("nan"))
        else:
            tensor.fill_(-1 if tensor.dtype.is_signed else 0)


@dataclass
class _InPlace:
    """What an overwriting call left: its return value and the inputs it wrote into."""

    result: Any
    written: dict[str, torch.Tensor]


def _bound(definition: Definition, calling: Calling, inputs, reference, device):
    """A zero-argument call on these inputs, and its untimed preparation: poisoned outputs, and
    fresh copies of the inputs the call overwrites (so the copies are never timed)."""
    call, prepare, _ = _bound_arguments(definition, calling, inputs, reference, device)
    return call, prepare


def _bound_arguments(definition: Definition, calling: Calling, inputs, reference, device):
    """:func:`_bound`, and the arguments the call gets (by name)."""
    filled = calling.returned(definition) if calling.destination_passing else []
    outputs = _outputs(filled, device, reference)
    written = {n: torch.empty_like(inputs[n]) for n in calling.overwrites}
    arguments = {**inputs, **written, **outputs}
    for name, dims in calling.dynamic.items():  # once here, not inside the timed call
        if isinstance(arguments.get(name), torch.Tensor):
            torch._dynamo.maybe_mark_dynamic(arguments[name], dims)

    def prepare() -> None:
        for name, copy in written.items():
            copy.copy_(inputs[name])
        _poison(outputs)

    def call() -> Any:
        result = calling.run(**arguments)
        if calling.destination_passing:
            result = outputs
        return _InPlace(result, written) if written else result

    return call, prepare, arguments


def per_step_inputs(definition: Definition) -> list[str]:
    """The inputs an engine's previous kernel has just written when it runs this one: those sized
    by the step (a var axis), the KV cache aside (sized by its pages, written over many steps);
    weights have const axes only. Under ``warm_inputs`` they are read back into the L2 before
    each timed call."""
    var = set(definition.var_axes)
    return [name for name, spec in definition.inputs.items()
            if spec.shape and "num_pages" not in spec.shape and any(axis in var for axis in spec.shape)]


def _named(definition: Definition, result: Any, calling: Calling) -> dict[str, Any]:
    """The call's outputs by name: returned (or filled), and held by the inputs it overwrote."""
    returned = calling.returned(definition)
    written: dict[str, torch.Tensor] = {}
    if isinstance(result, _InPlace):
        result, written = result.result, result.written
    named = result if calling.destination_passing else (outputs_by_name(definition, result, returned) if returned else {})
    named = dict(named)
    for source, output in calling.overwrites.items():
        if output is not None:
            named[output] = written[source]
    return named


def _first_call(definition: Definition, calling: Calling, inputs, reference, device: torch.device) -> None:
    """One untimed call before the checks, so that what it costs once (Triton and FlashInfer JIT,
    torch.compile, autotuning) shows as its own phase; inputs it changed are put back (the check
    that follows reports the change)."""
    before = _snapshot(inputs)
    call, prepare = _bound(definition, calling, inputs, reference, device)
    prepare()
    try:
        call()  # raising: a runtime error, handled (and the worker restarted if CUDA broke) by evaluate
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        with contextlib.suppress(Exception):  # a broken CUDA context: the worker is restarted anyway
            _restore(inputs, before)


def _compile_first(definition: Definition, calling: Calling, task: Task, device: torch.device, phases: Phases) -> None:
    """A ``torch.compile``'d solution's first call in this process, on ``task.compile_workload``
    (its Definition's largest workload): the call that compiles it and autotunes Inductor's
    kernels, whose launch configurations then serve every workload. First called on a few tokens,
    Inductor picked a block size that ran SwiGLU on 16k tokens 1.15x slower than the same kernel
    source in vLLM, which compiles at its largest batch (H100)."""
    key = content_hash(Solution.model_validate(task.solution))
    if key in _COMPILED_FIRST:
        return
    _COMPILED_FIRST.add(key)
    inputs, reference = _inputs(definition, Workload.model_validate(task.compile_workload), Path(task.root), device, 0, phases)
    with phases("first call"):
        _first_call(definition, calling, inputs, reference, device)


def _check_draws(definition, calling, draws, device) -> dict:
    """Outputs against the reference's on every draw: exact shape and dtype, inputs unchanged,
    allclose per dtype, and a fresh input must not give the previous output."""
    total: Optional[Diff] = None
    previous: Optional[tuple[dict, dict]] = None
    for inputs, reference in draws:
        before = _snapshot(inputs)
        call, prepare = _bound(definition, calling, inputs, reference, _device_of(inputs))
        prepare()
        try:
            result = call()
        except Exception as exc:
            _restore(inputs, before)
            raise Failed("runtime_error", _tail(exc)) from None
        try:
            outputs = _named(definition, result, calling)
        except ValueError as exc:
            raise Failed("incorrect_shape", f"outputs: {exc}") from None
        changed = _restore(inputs, before)
        if changed:
            raise Failed("mutates_input", f"inputs changed by the call: {', '.join(changed)}")
        for name, ref in calling.checked(reference).items():
            out = outputs[name]
            if not isinstance(out, torch.Tensor):
                raise Failed("incorrect_shape", f"{name}: returned {type(out).__name__}, not a tensor")
            if tuple(out.shape) != tuple(ref.shape):
                raise Failed("incorrect_shape", f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
            if out.dtype != ref.dtype:
                raise Failed("incorrect_dtype", f"{name}: dtype {out.dtype}, expected {ref.dtype}")
        if previous is not None and not _same(previous[1], reference) and _same(previous[0], outputs):
            raise Failed("stale_output", "a fresh input gave the same output as the previous one (cached?)")
        diff = _diff_all(definition, outputs, calling.checked(reference))
        total = diff if total is None else total.merge(diff)
        if not diff.ok:
            raise Failed(
                "incorrect_numerical",
                f"{diff.mismatched} of {diff.total} elements off (max abs {diff.max_abs:.3g}, max rel {diff.max_rel:.3g}; "
                f"atol {diff.atol}, rtol {diff.rtol})",
                _check_dict(total, len(draws), calling.unchecked),
            )
        previous = ({n: o.clone() for n, o in outputs.items()}, calling.checked(reference))
    assert total is not None
    return _check_dict(total, len(draws), calling.unchecked)


#: inputs above this many bytes are kept as a fingerprint, not a copy, while a call runs
_COPY_LIMIT = 1 << 30


@dataclass(frozen=True)
class _Fingerprint:
    """A large input's bytes summed per 64 KiB (any dtype, fp8 included): what a call that writes
    into it changes, without a copy of it held (DeepSeek-V3's expert weights are 15 GiB)."""

    sums: torch.Tensor

    @staticmethod
    def of(tensor: torch.Tensor) -> "_Fingerprint":
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        whole = raw.numel() - raw.numel() % _CHUNK
        # a sum in another dtype casts a copy first: a slice at a time (a chunk's bytes fit int32)
        sums = [raw[start:min(start + _SLICE, whole)].view(-1, _CHUNK).sum(dim=1, dtype=torch.int32)
                for start in range(0, whole, _SLICE)]
        tail = raw[whole:].sum(dtype=torch.int32).reshape(1)
        return _Fingerprint(torch.cat([*sums, tail]))

    def matches(self, tensor: torch.Tensor) -> bool:
        return torch.equal(self.sums, _Fingerprint.of(tensor).sums)


_CHUNK = 1 << 16
_SLICE = _CHUNK << 12  # 256 MiB of bytes at a time: a 1 GiB int32 copy


def _snapshot(inputs: dict[str, Any]) -> dict[str, Any]:
    return {n: (_Fingerprint.of(v) if v.numel() * v.element_size() > _COPY_LIMIT else v.clone())
            for n, v in inputs.items() if isinstance(v, torch.Tensor)}


def _restore(inputs: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """The inputs a call changed, put back as they were: they are the worker's cached draw, which
    the workload's other solutions get next. A large input kept as a fingerprint cannot be put
    back: the cached draws are dropped instead (the next pair draws its inputs again)."""
    changed = []
    for name, kept in before.items():
        if isinstance(kept, _Fingerprint):
            if not kept.matches(inputs[name]):
                changed.append(name)
                _INPUTS.clear()
        elif not torch.equal(kept, inputs[name]):
            changed.append(name)
            inputs[name].copy_(kept)
    return changed


def _device_of(inputs: dict[str, Any]) -> torch.device:
    return next(v.device for v in inputs.values() if isinstance(v, torch.Tensor))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def _diff_all(definition: Definition, outputs: dict[str, Any], reference: dict[str, Any]) -> Diff:
    total: Optional[Diff] = None
    family = family_of(definition.op_type)
    atol_of_largest = family is not None and family.checks_atol_of_largest(definition)
    rounded_through = family.rounds_through(definition) if family is not None else None
    as_sets = family.unordered_rows(definition) if family is not None else ()
    scaled_by = family.atol_scaled_by(definition) if family is not None and atol_of_largest else {}
    for name, ref in reference.items():
        if name in as_sets:
            diff = compare_sets(outputs[name], ref)
        else:
            other = reference.get(scaled_by.get(name, ""))
            elsewhere = largest_magnitude(other) if isinstance(other, torch.Tensor) else 0.0
            diff = compare(outputs[name], ref, atol_of_largest, rounded_through, elsewhere)
        total = diff if total is None else total.merge(diff)
    assert total is not None
    return total


def _check_dict(diff: Diff, draws: int, unchecked: frozenset[str] = frozenset()) -> dict:
    return {
        "unchecked": sorted(unchecked),
        "max_abs_diff": diff.max_abs if math.isfinite(diff.max_abs) else 1e308,
        "max_rel_diff": diff.max_rel if math.isfinite(diff.max_rel) else 1e308,
        "mismatch_ratio": diff.ratio,
        "atol": diff.atol,
        "rtol": diff.rtol,
        "draws": draws,
        "method": diff.method or ("allclose" if diff.atol or diff.rtol else "exact"),
    }


def _check_distribution(definition, calling, draws, device) -> dict:
    """Sampling: the solution's draws and the reference's, over the same probabilities (the first
    draw's), must have close empirical distributions (mean total-variation distance over rows)."""
    inputs, reference = draws[0]
    name = next(iter(definition.outputs))
    call, prepare = _bound(definition, calling, inputs, reference, device)
    ours, theirs = [], []
    for _ in range(SAMPLING_DRAWS):
        prepare()
        out = _named(definition, call(), calling)[name]
        if tuple(out.shape) != tuple(reference[name].shape):
            raise Failed("incorrect_shape", f"{name}: shape {tuple(out.shape)}, expected {tuple(reference[name].shape)}")
        if out.dtype != reference[name].dtype:
            raise Failed("incorrect_dtype", f"{name}: dtype {out.dtype}, expected {reference[name].dtype}")
        ours.append(out.clone())
        theirs.append(run_reference(definition, inputs)[name])
    distance = distribution_distance(torch.stack(ours).cpu(), torch.stack(theirs).cpu())
    check = {
        "max_abs_diff": distance,
        "max_rel_diff": distance,
        "mismatch_ratio": min(1.0, distance),
        "atol": SAMPLING_MAX_DISTANCE,
        "rtol": 0.0,
        "draws": SAMPLING_DRAWS,
        "method": "distribution",
    }
    if distance > SAMPLING_MAX_DISTANCE:
        raise Failed("incorrect_numerical", f"sampled distribution off: total variation {distance:.3f}", check)
    return check


@dataclass(frozen=True)
class CheckMethod:
    """How an op family's outputs are judged against its reference."""

    #: (definition, calling, draws, device) -> the check record; raises Failed
    check: Callable[..., dict]
    #: the last timed call's output is compared with the reference again (not for random outputs)
    recheck_last_output: bool = True


#: the checks an op family names (:attr:`fi_profile.families.family.Family.check`); a Definition of
#: no family is checked elementwise (allclose per dtype)
CHECKS: dict[str, CheckMethod] = {
    "elementwise": CheckMethod(_check_draws),
    "distribution": CheckMethod(_check_distribution, recheck_last_output=False),
}


def check_method(definition: Definition) -> CheckMethod:
    family = family_of(definition.op_type)
    return CHECKS[family.check if family is not None else "elementwise"]


def _cuda_broken(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
        return False
    except Exception:
        return True


def _tail(exc: BaseException, limit: int = 3000) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-limit:]
