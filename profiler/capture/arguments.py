"""Reading a hooked engine method's arguments by name, from the method's own signature.

A hook point's ``to_calls`` names the arguments it needs with the engine's parameter names
(``def lm_head(self, lm_head, hidden_states)``); which position each one has in a call is read
once, when the hook is installed, from the engine method's signature. A call then costs a few
tuple lookups, and an engine whose parameters were renamed or reordered is either read right or
reported as a hook point that does not fit, never read from the wrong argument.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional

_EMPTY = inspect.Parameter.empty
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
#: the method a dispatcher such as ``CustomOp.forward(self, *args, **kwargs)`` passes its arguments to
_DISPATCH_TARGETS = ("forward_native",)


class SignatureMismatch(Exception):
    """The engine method does not take an argument the hook needs."""


def engine_signature(fn: Callable[..., Any], cls: Optional[type] = None) -> inspect.Signature:
    """``fn``'s signature, or for a dispatcher (``*args``) that of the method it dispatches to; a
    callable whose signature cannot be read (a registered torch op) takes keywords only."""
    try:
        signature = inspect.signature(fn)
    except (ValueError, TypeError):
        return inspect.Signature([inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    dispatches = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())
    if not dispatches or cls is None:
        return signature
    for name in _DISPATCH_TARGETS:
        target = inspect.getattr_static(cls, name, None)
        if target is None:
            continue
        signature = inspect.signature(getattr(cls, name))
        if isinstance(target, staticmethod):  # called through the instance: ``self`` comes first
            self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
            signature = signature.replace(parameters=[self_param, *signature.parameters.values()])
        return signature
    return signature


class ArgumentReader:
    """``reader(args, kwargs)`` -> the arguments ``wanted`` names, by name; where ``wanted`` takes
    ``**extra``, also the keyword arguments a call passed that the engine method does not name
    (those its own ``**kwargs`` takes: SGLang's attention layer's ``sinks``), so that the hook can
    read them and list any it does not know."""

    __slots__ = ("plan", "extra", "engine_names")

    def __init__(self, engine: inspect.Signature, wanted: inspect.Signature, where: str) -> None:
        params = engine.parameters
        self.extra = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in wanted.parameters.values())
        self.engine_names = frozenset(params)
        positional = [p.name for p in params.values() if p.kind in _POSITIONAL]
        open_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        plan = []
        for param in wanted.parameters.values():
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            theirs = params.get(param.name)
            if theirs is None and param.default is _EMPTY and not open_keywords:
                raise SignatureMismatch(f"{where}{engine} has no argument {param.name!r}")
            position = positional.index(param.name) if param.name in positional else None
            default = theirs.default if theirs is not None and theirs.default is not _EMPTY else param.default
            plan.append((param.name, position, default))
        self.plan = tuple(plan)

    def __call__(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        named = {}
        for name, position, default in self.plan:
            if position is not None and position < len(args):
                named[name] = args[position]
            elif name in kwargs:
                named[name] = kwargs[name]
            elif default is not _EMPTY:
                named[name] = default
            else:
                raise TypeError(f"argument {name!r} was not passed")
        if self.extra:
            named.update((k, v) for k, v in kwargs.items() if k not in self.engine_names and k not in named)
        return named


def argument_reader(fn: Callable[..., Any], to_calls: Callable[..., Any], cls: Optional[type] = None,
                    where: str = "") -> ArgumentReader:
    """How to read ``to_calls``'s arguments out of a call of the engine method ``fn``."""
    return ArgumentReader(engine_signature(fn, cls), inspect.signature(to_calls), where or getattr(fn, "__qualname__", "method"))
