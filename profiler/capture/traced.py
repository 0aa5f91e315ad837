"""Hooked calls inside code that torch.compile traces: recorded once, while traced, as templates.

Under torch.compile the model's forward is traced once by Dynamo, with symbolic sizes, and then
runs as compiled code (and CUDA graphs) in which no Python hook runs. So a hook that Dynamo traces
records, at trace time, what it would record: ``torch._dynamo.comptime`` runs a callback while
Dynamo traces and adds nothing to the graph. The callback gets the hooked method's arguments as
Dynamo sees them (the real module, fake tensors whose sizes are symbols), turns them into kernel
calls as the hook would, and keeps them as a :class:`Template` of the traced forward: Definitions
are fixed; var-axis values are expressions of the forward's symbolic sizes. Which symbol is which
argument's dimension is read from the traced forward's own arguments.

Each time the compiled forward runs, the engine integration reads that run's sizes from its real
arguments (:func:`sizes_of_run`: the sizes the compiled code really ran with, the padded batch
where the engine pads for a CUDA graph) and :func:`fi_profile.capture.graph_runs.count_graph_run`
makes each template one hooked invocation of the step. Live ops (attention, whose layout changes
every step) template a callable instead, which builds the step's calls from the engine's per-step
metadata.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, Callable, Hashable, Mapping, Optional

from fi_profile.capture.kernel_call import KernelCall

#: a live op's trace-time result: called each step to build that step's calls
LiveCalls = Callable[[], list[KernelCall]]


@dataclass
class Template:
    op: str
    #: calls with var-axis values as ints or sympy expressions of the forward's size symbols
    calls: list[KernelCall] = field(default_factory=list)
    live: Optional[LiveCalls] = None
    error: Optional[str] = None  # the hook failed while traced: counted as lost every step
    #: a CUDA graph's nodes this call's kernels are, [first, end) in capture order (None: not known)
    nodes: Optional[tuple[int, int]] = None
    #: a prologue's: the Definitions whose inputs it computes (its kernels are theirs; it records
    #: no call of its own: the call it prepares does)
    prologue: tuple[str, ...] = ()
    #: where it records nothing itself, the op of the next call whose kernels its own are (SGLang's
    #: ``TopK`` before its experts: the routing is part of the MoE Definition)
    feeds: str = ""
    #: a hooked method that made inner calls: how many templates of them are before it and after it
    #: (after: where it goes before one of them, a recurrent layer's). Its Python's own kernels
    #: between them (the input projection's split, the output's buffer) are its call's, as when it
    #: runs eagerly (its range encloses its inner calls' ranges), and a compiled graph may run its
    #: kernels and theirs in another order (Inductor's scheduling of independent ops)
    span: Optional[tuple[int, int]] = None
    #: where its method is a span (:func:`~fi_profile.capture.graph_capture.spanning`) captured in a
    #: CUDA graph: the nodes the method launched after its last inner call (SGLang's logits
    #: processor casts the lm_head's output to float32 for the sampler), None where not read
    tail: Optional[int] = None

    def realize(self, sizes: Mapping[str, int]) -> list[KernelCall]:
        if self.live is not None:
            return self.live()
        return [KernelCall(c.definition, {k: _evaluate(v, sizes) for k, v in c.axes.items()}, c.tensors, c.scalars)
                for c in self.calls]


@dataclass
class Trace:
    """What one Dynamo trace of a forward recorded."""

    output_graph: int  # a restarted trace or a recompile starts over
    #: size symbol -> (the forward's argument name, dimension)
    symbols: dict[str, tuple[str, int]]
    templates: list[Template] = field(default_factory=list)
    #: where the templates of hooked methods being traced began (:func:`at_entry`), innermost last
    entries: list[int] = field(default_factory=list)
    #: how its calls ran, for the record: ``compiled`` (inside a torch.compile graph) or
    #: ``cuda_graph`` (each its own kernel, replayed from a CUDA graph)
    where: str = "compiled"
    #: (templates seen, groups, live groups, fixed, live groups' offsets), computed once
    _groups: Optional[tuple[int, list, list, int, tuple[int, ...]]] = None

    def groups(self) -> list[tuple[str, "Template", int]]:
        """The templates as (op, template, layers): templates that make the same calls (the
        layers of one shape: the same Definitions, the same axis expressions; for live ones the
        same per-step callable) are one group, so a step realizes and records each group once."""
        if self._groups is None or self._groups[0] != len(self.templates):
            groups: dict[Hashable, list] = {}
            for t in self.templates:
                groups.setdefault(_same_calls(t), [t.op, t, 0])[2] += 1
            grouped = [tuple(g) for g in groups.values()]
            live = [(op, t.live, n) for op, t, n in grouped if t.live is not None]
            fixed = len(self.templates) - sum(n for _, _, n in live)
            starts = itertools.accumulate((n for _, _, n in grouped), initial=0)
            offsets = tuple(start for start, (_, t, _) in zip(starts, grouped) if t.live is not None)
            self._groups = (len(self.templates), grouped, live, fixed, offsets)
        return self._groups[1]  # type: ignore[return-value]

    def live_groups(self) -> list[tuple[str, LiveCalls, int]]:
        """The live groups (attention layers of one shape), with how many layers each: a step's
        calls of them are built, and recorded, once per group."""
        self.groups()
        assert self._groups is not None
        return self._groups[2]

    def live_offsets(self) -> tuple[int, ...]:
        """Where each live group's first invocation is among a step's invocations recorded group
        by group (:meth:`groups`' order, each group's layers in a row): a step learned with every
        group in it (count-only) has their labels there."""
        self.groups()
        assert self._groups is not None
        return self._groups[4]

    @property
    def fixed(self) -> int:
        """Templates that are the same in every step of one size (all but the live ones)."""
        self.groups()
        assert self._groups is not None
        return self._groups[3]


def _same_calls(template: Template) -> Hashable:
    """A key equal for templates that make the same calls in every step."""
    if template.live is not None:
        live = template.live
        return ("live", template.op, getattr(live, "func", live), getattr(live, "args", ()))
    try:
        key = ("fixed", template.op, template.error, tuple(
            (c.definition.name, tuple((k, getattr(getattr(v, "node", None), "expr", v)) for k, v in c.axes.items()),
             tuple(c.scalars.items()), tuple((k, id(v)) for k, v in c.tensors.items()))
            for c in template.calls))
        hash(key)
        return key
    except TypeError:  # an axis value that cannot be compared: a group of its own
        return ("own", id(template))


class _NotTracedYet:
    """An argument the hook may not read while traced (using it would change the graph)."""

    def __repr__(self) -> str:
        return "<argument not traced yet>"


NOT_TRACED_YET = _NotTracedYet()

#: the traced forwards of this process, by the code object Dynamo traced
TRACES: dict[CodeType, Trace] = {}


def _trace(ctx: Any) -> tuple[Trace, Any]:
    """The trace ``ctx`` (Dynamo's context) records into (a new one where Dynamo restarted), and its root."""
    tx = ctx._ComptimeContext__tx  # noqa: SLF001 - the translator: which forward this trace is of
    root = tx.output.root_tx
    trace = TRACES.get(root.f_code)
    if trace is None or trace.output_graph != id(tx.output):
        trace = TRACES[root.f_code] = Trace(id(tx.output), {})
    return trace, root


def at_entry(ctx: Any) -> None:
    """The ``comptime`` callback as a hooked method begins to be traced: where its inner calls'
    templates start (:attr:`Template.span`; :func:`at_trace`'s ``before``)."""
    trace, _ = _trace(ctx)
    trace.entries.append(len(trace.templates))


def at_trace(ctx: Any, op: str, to_calls: Callable[..., Any], read: Callable[..., dict], before: str = "") -> None:
    """The ``comptime`` callback of a hooked method being traced (``ctx``: Dynamo's context). Its
    template follows the templates of the calls it made, or, ``before`` an op, goes before its last
    inner call of that op (a recurrent layer's core runs between its input projections and its
    gated norm; its hook is on the layer, whose other calls are hooked on their own; a gated
    attention's output gate runs between its attention and its output projection's GEMM). :func:`at_entry`
    marked where its inner calls' templates began (its :attr:`Template.span`)."""
    trace, root = _trace(ctx)
    for symbol, where in _size_symbols(root).items():  # the forward's arguments used so far
        trace.symbols.setdefault(symbol, where)

    def make_calls() -> Any:
        args = _value(ctx.get_local("args")._i_will_not_complain_if_bc_breaks_VariableTracker())
        kwargs = _value(ctx.get_local("kwargs")._i_will_not_complain_if_bc_breaks_VariableTracker())
        return to_calls(**read(tuple(args), dict(kwargs)))

    made = template(op, make_calls, "traced")
    start = trace.entries.pop() if trace.entries else len(trace.templates)
    at = next((i for i in reversed(range(start, len(trace.templates))) if trace.templates[i].op == before),
              len(trace.templates))
    if len(trace.templates) > start:
        made.span = (at - start, len(trace.templates) - at)
    trace.templates.insert(at, made)


def template(op: str, make_calls: Callable[[], Any], while_: str = "captured") -> Template:
    """``op``'s template from what its hook makes: calls, or a live op's per-step callable; a hook
    that raises gives a template that counts as lost every step (never passed on)."""
    made = Template(op)
    try:
        calls = make_calls()
        if callable(calls):
            made.live = calls
        else:
            made.calls = [c for c in calls if c is not None]
    except Exception as exc:  # noqa: BLE001 - a hook must never break the trace or the capture
        made.error = f"{op} ({while_}): {type(exc).__name__}: {exc}"[:300]
    return made


def sizes_of_run(trace: Trace, forward: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> dict[str, int]:
    """The size symbols' values in one run of the compiled forward (its real arguments). An argument
    of another rank than the traced one's is passed over: a whole-model graph's wrapper may take
    ``input_ids`` as ``[tokens]`` where the forward it wraps got ``[1, tokens]`` (vLLM's
    Transformers backend); its caller fills the token count in."""
    bound = _signature(forward).bind_partial(*args, **kwargs).arguments
    sizes = {}
    for symbol, (name, dim) in trace.symbols.items():
        value = bound.get(name)
        if value is not None and hasattr(value, "shape") and dim < len(value.shape):
            sizes[symbol] = int(value.shape[dim])
    return sizes


@functools.lru_cache(maxsize=None)
def _signature(forward: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(forward)


def _size_symbols(root: Any) -> dict[str, tuple[str, int]]:
    symbols: dict[str, tuple[str, int]] = {}
    for name, var in root.symbolic_locals.items():
        if type(var).__name__ == "LazyVariableTracker" and not var.is_realized():
            continue  # not used yet: realizing it would add the graph input earlier, reordering them
        _add_symbols(symbols, name, _value(var))
    for name, node in _keyword_inputs(root):
        _add_symbols(symbols, name, node.meta.get("example_value"))
    return symbols


def _add_symbols(symbols: dict[str, tuple[str, int]], name: str, fake: Any) -> None:
    for dim, size in enumerate(getattr(fake, "shape", ())):
        expr = getattr(getattr(size, "node", None), "expr", None)
        if expr is not None and expr.is_Symbol:
            symbols.setdefault(str(expr), (name, dim))


def _keyword_inputs(root: Any) -> list[tuple[str, Any]]:
    """The graph's inputs that the traced forward got by keyword through its ``**kwargs``, each with
    the keyword: the argument's name. A decorated forward is traced from its decorator's
    ``wrapper(*args, **kwargs)`` (transformers' models, which vLLM's Transformers backend compiles:
    ``input_ids`` is ``kwargs['input_ids']``), whose dict is never a local tensor of its own."""
    code = root.f_code
    if not code.co_flags & inspect.CO_VARKEYWORDS:
        return []
    named = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS)
    varkw = code.co_varnames[named]
    found = []
    for node in getattr(root.output, "placeholders", ()):
        source = getattr(node.meta.get("grapharg"), "source", None)
        base, key = getattr(source, "base", None), getattr(source, "index", None)
        if getattr(base, "local_name", None) == varkw and isinstance(key, str):
            found.append((key, node))
    return found


def _value(var: Any) -> Any:
    """The Python value behind one of Dynamo's variable trackers: a fake tensor for a tensor, the
    real object for a module or a constant, containers element by element."""
    kind = type(var).__name__
    if kind == "LazyVariableTracker":
        if not var.is_realized():  # a graph input the traced code has not used yet: realizing it
            return NOT_TRACED_YET  # here would add its placeholder earlier and reorder the graph's inputs
        var = var.realize()
        kind = type(var).__name__
    if kind == "TensorVariable":
        return var.as_proxy().node.meta["example_value"]
    if kind == "SymNodeVariable":
        return var.sym_num
    if kind in ("TupleVariable", "ListVariable"):
        return [_value(item) for item in var.items]
    if kind == "ConstDictVariable":
        return {key.vt.as_python_constant(): _value(item) for key, item in var.items.items()}
    try:
        return var.as_python_constant()
    except Exception:  # noqa: BLE001 - not a constant: the object it stands for
        return getattr(var, "value", None)


def _evaluate(value: Any, sizes: Mapping[str, int]) -> int:
    node = getattr(value, "node", None)
    expr = getattr(node, "expr", value)
    if isinstance(expr, int):
        return expr
    if expr.is_Symbol:  # the common case: an axis is the token count itself (``str`` costs ~10 us)
        return sizes[expr.name]
    names, fn = _compiled_expression(expr)
    return int(fn(*(sizes[n] for n in names)))


@functools.lru_cache(maxsize=None)
def _compiled_expression(expr: Any) -> tuple[tuple[str, ...], Callable[..., Any]]:
    """``expr`` as a plain Python function of its symbols (sympy's ``subs`` costs ~100 us a call;
    a learned step evaluates every template's axes)."""
    import sympy

    symbols = sorted(expr.free_symbols, key=str)
    return tuple(str(s) for s in symbols), sympy.lambdify(symbols, expr, modules=[{"FloorDiv": lambda a, b: a // b}, "math"])
