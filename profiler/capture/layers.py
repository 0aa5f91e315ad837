"""Which layers of a built model the hooks record: each layer judged by the rule of its class
(``run.not_covered`` lists the layers no Definition computes, by kind), marked when a call of it
reaches its hook (``unseen_layers`` lists covered layers no call of which was seen), and the
helpers the families' hooks use for both (:func:`seen`, :func:`require`)."""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch

#: A layer's exact class decides its Definition: a subclass or a sibling computes something else
#: (another RoPE scaling, a norm with another weight convention), so it is either known here by its
#: own name or reported as not covered, never recorded as the class it derives from.


def exact_class(*names: str) -> Callable[[Any], Optional[str]]:
    """A rule for layers whose hook records exactly the classes ``names``."""

    def problem(layer: Any) -> Optional[str]:
        name = type(layer).__name__
        return None if name in names else f"{name} (a {names[0]} variant no Definition computes)"

    return problem


def covered(layer: Any) -> Optional[str]:
    """A rule for layers whose hook records every instance (or that launch no kernel themselves)."""
    return None


#: ids of layer weights that a fused kernel's hook saw (SGLang's q/k norm kernel takes the RMSNorm
#: layers' weights, not the layers): those layers count as seen
SEEN_WEIGHTS: set[int] = set()


def seen_weights(*weights: Any) -> None:
    SEEN_WEIGHTS.update(id(w) for w in weights if w is not None)


def seen(*layers: Any) -> None:
    """These layers' calls reached their hook (checked at the end: :func:`unseen_layers`)."""
    for layer in layers:
        if layer is not None:
            layer.__dict__["_fi_profile_seen"] = True


def record_by(op: str, *layers: Any) -> None:
    """These layers' calls are recorded by another hook (``op``'s: a MoE call that records the
    router and shared experts an opaque op runs); their own hooks leave them to it."""
    for layer in layers:
        if layer is not None:
            layer.__dict__["_fi_profile_recorded_by"] = op


def recorded_elsewhere(layer: Any) -> bool:
    return layer.__dict__.get("_fi_profile_recorded_by") is not None


@dataclass(frozen=True)
class KnownAttributes:
    """What a layer class's hook knows of the attributes of its instances (a layer's, or the
    implementation object it runs), so that one an engine version adds (vLLM's attention sinks
    were one) is listed by name instead of ignored: ``read``, those the hook reads into the
    Definition or judges itself; ``neutral``, name -> the value under which an attribute changes
    nothing the Definitions compute (ALiBi slopes None), or a test of its value; ``inert``, those
    that change no math (the layer's name, its backend, its cache tensor). Any other attribute is
    unknown: listed unless its value is empty (None, False, 0, -1, an empty container or tensor: a
    feature that is off)."""

    read: frozenset[str] = frozenset()
    neutral: Mapping[str, Any] = field(default_factory=dict)
    inert: frozenset[str] = frozenset()

    def problems(self, obj: Any, where: str = "", ignore: tuple[str, ...] = ()) -> list[str]:
        """What of ``obj`` (``where``: how to name it, ``impl.``) may change what it computes and no
        Definition accounts for: a neutral attribute off its neutral value, an unknown one not empty;
        ``ignore``: neutral attributes the caller reads for this object (a variant it records)."""
        found = []
        for name, value in _attributes(obj):
            if name in self.read or name in self.inert or name in ignore or name.startswith("_fi_profile"):
                continue
            if name in self.neutral:
                neutral = self.neutral[name]
                if not (neutral(value) if callable(neutral) else _equal(value, neutral)):
                    found.append(f"{where}{name}={_shown(value)}")
            elif not _empty(value):
                found.append(f"{where}{name}={_shown(value)} (an attribute fi-profile does not know)")
        return found


#: what frameworks set on any module, whatever it computes (transformers marks the modules whose
#: weights it initialised)
_BOOKKEEPING = frozenset({"_is_hf_initialized"})


@functools.lru_cache(maxsize=1)
def _module_internals() -> frozenset[str]:
    import torch

    return frozenset(vars(torch.nn.Module())) | _BOOKKEEPING


def _attributes(obj: Any) -> Iterator[tuple[str, Any]]:
    """An object's own attributes; a torch module's parameters, buffers and children among them, its
    own bookkeeping (hooks, training mode) not."""
    own = vars(obj) if hasattr(obj, "__dict__") else {}
    internals = _module_internals() if "_parameters" in own else frozenset()
    for name, value in own.items():
        if name not in internals:
            yield name, value
    for group in ("_parameters", "_buffers", "_modules"):
        yield from (own.get(group) or {}).items() if internals else ()


def _empty(value: Any) -> bool:
    if value is None or value is False or (isinstance(value, (int, float)) and value in (0, -1)):
        return True
    if isinstance(value, (str, tuple, list, dict, set, frozenset)):
        return len(value) == 0 or (isinstance(value, tuple) and all(_empty(v) for v in value))
    numel = getattr(value, "numel", None)
    return callable(numel) and hasattr(value, "shape") and numel() == 0


def _equal(value: Any, neutral: Any) -> bool:
    try:
        return bool(value == neutral)
    except Exception:  # noqa: BLE001 - a tensor compared with a scalar: not the neutral value
        return False


def _shown(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"{type(value).__name__}{list(shape)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def judged_once(layer: Any, problem: Callable[[Any], Optional[str]]) -> Optional[str]:
    """``problem(layer)``, judged at the layer's first call and kept on it: a hot hook (an eager
    attention layer, every call) does not audit the same attributes again."""
    found = layer.__dict__.get("_fi_profile_problem")
    if found is None:
        found = layer.__dict__["_fi_profile_problem"] = (problem(layer),)
    return found[0]


def require(problem: Optional[str]) -> None:
    """A hooked layer no Definition computes: its calls are lost, never recorded as another's."""
    if problem is not None:
        raise NotImplementedError(f"{problem}: not recorded (listed in run.not_covered)")


@dataclass(frozen=True)
class LayerRule:
    """Layers of ``base`` (``module:Class``, or every instance of its subclasses; or layers whose
    ``quant_method`` is one: a quantization method a hook records) are judged by ``problem``: why
    one is not covered, or None."""

    base: str
    problem: Callable[[Any], Optional[str]]
    #: a layer that runs its children's hooked calls (judged itself, its children one by one too),
    #: not a kernel of its own
    container: bool = False
    #: a container's children that its own hooks record (covered where it is: its verdict says
    #: what they miss), not judged by their class's rule
    records: Optional[Callable[[Any], Iterable[Any]]] = None


def by_layer_class(layer: Any) -> Optional[str]:
    """The problem of a quantization method that holds only scales for a computation the layer's
    class decides (a KV cache's: the cache's dtype is the engine's): its layer is judged by the
    rule for its class, never by the method's name."""
    return None


def _resolve(path: str) -> Optional[type]:
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - an engine version without it: nothing of it to judge
        return None


def _own_forward(module: Any, method: str) -> Optional[str]:
    """Why a layer with a quantization method is not covered by its method's hook: a model's own
    subclass of a linear layer whose ``forward``, defined in the model's module, may run a kernel of
    its own past the method (SGLang's ``TinyGemmLinear`` of gpt-oss, FlashInfer's tinygemm up to
    128 tokens), unless a hook records that forward; or None."""
    forward = getattr(type(module), "forward", None)
    where = str(getattr(forward, "__module__", "") or "")
    if forward is None or getattr(forward, "__fi_profile_original__", None) is not None or not _model_code(where):
        return None
    return (f"{type(module).__name__} with a forward of its own ({where}) that may run its kernel past its {method}, "
            "which no hook records")


#: what a layer holds that runs its children's calls and, where set, computes something between them
#: in its own code: such a layer is listed unless a rule judges its class. A flag (Hugging Face's
#: config name) set True: a gated attention's ``attn_output_gate`` (the output times the sigmoid of
#: a gate); or a layer under that name: vLLM's Qwen2-MoE MLP's ``expert_gate`` (its output times the
#: sigmoid of that layer's one logit per token)
CONTAINER_COMPUTES = ("attn_output_gate", "expert_gate")

#: a number (or numbers) a layer of an engine's model code holds under a name ending so multiplies
#: in that layer's own code (muP models: Granite's ``residual_multiplier`` and ``embedding_multiplier``,
#: Falcon-H1's ``attention_in_multiplier``, ``ssm_out_multiplier``, its MLP's ``gate_multiplier``, ...)
MULTIPLIER_SUFFIXES = ("_multiplier", "_multipliers")

#: such multipliers that the layer hands to a layer beneath it as that layer's own argument, judged
#: by that layer's rule: an attention's softmax scale (Granite), the logits' scale (Falcon-H1).
#: (Falcon-H1's ``zxbcdt_multipliers`` reach its Mamba-2 mixer only at a call, as a muP vector:
#: listed here, and the call is lost.)
MULTIPLIERS_PASSED_ON = ("attention_multiplier", "lm_head_multiplier")


def _numbers(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def computes_in_own_code(module: Any) -> list[str]:
    """What ``module`` holds that it computes with in its own code: the :data:`CONTAINER_COMPUTES`
    it has set (a flag True, or a layer) and, in an engine's model code, every multiplier it holds
    (:data:`MULTIPLIER_SUFFIXES`; any value, 1.0 too: the code multiplies all the same) but those it
    passes on (:data:`MULTIPLIERS_PASSED_ON`)."""
    found = held_set(module, CONTAINER_COMPUTES)
    if _model_code(type(module).__module__):
        found += [name for name, value in vars(module).items() if name.endswith(MULTIPLIER_SUFFIXES)
                  and name not in MULTIPLIERS_PASSED_ON and _numbers(value)]
    return found


def held_set(module: Any, names: Iterable[str]) -> list[str]:
    """Of ``names``, those ``module`` has set: a flag True, or a layer (cheap: a hook's path)."""
    held = {name: getattr(module, name, None) for name in names}
    return [name for name, value in held.items() if value is True or isinstance(value, torch.nn.Module)]


def own_code_problem(module: Any, computes: Iterable[str]) -> str:
    """How a layer computing with ``computes`` in its own code is listed."""
    return f"{type(module).__name__} with {', '.join(computes)} (computed in the layer's own code: no hook records it)"


#: torch's own layers with weights, which a model may use past the engine's layer classes (SGLang's
#: Gemma-3 embeds with a subclass of ``nn.Embedding``): each runs a kernel of its own
TORCH_LAYERS = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.Embedding, torch.nn.EmbeddingBag, torch.nn.LayerNorm,
                torch.nn.GroupNorm, torch.nn.RMSNorm, torch.nn.modules.conv._ConvNd,
                torch.nn.modules.batchnorm._NormBase, torch.nn.MultiheadAttention, torch.nn.RNNBase)


def _torch_base(module: Any) -> str:
    base = next(cls for cls in type(module).__mro__ if cls in TORCH_LAYERS)
    return f"nn.{base.__name__.lstrip('_')}"


def _model_code(module_name: str) -> bool:
    """Whether a Python module is an engine's model code (``vllm.model_executor.models.*``,
    ``sglang.srt.models.*``), not its layers."""
    return ".models." in f".{module_name}."


def _own_weights(module: Any) -> bool:
    return any(p is not None for p in module.__dict__.get("_parameters", {}).values())


def _leaf(module: Any) -> bool:
    return next(module.children(), None) is None


def _transformers_leaf(module: Any) -> bool:
    """A module of transformers' own code with no layers inside it (an activation such as
    ``GELUTanh``, a rotary embedding's cos/sin): a model that vLLM or SGLang runs on its Transformers
    modeling backend (an architecture the engine has no class of) keeps them, and they run kernels
    of their own. Containers (a decoder layer, an MLP) are looked into instead."""
    return type(module).__module__.startswith("transformers.") and _leaf(module)


def _models_own_weighted_leaf(module: Any) -> bool:
    """A module with no layers inside it and weights of its own, defined in an engine's model code
    (vLLM's Command-R ``LayerNorm``, a plain ``nn.Module`` with a weight that runs its own norm):
    it computes with its weights, and no rule knows its class."""
    return _model_code(type(module).__module__) and _leaf(module) and _own_weights(module)


def _judged_layers(model: Any, rules: Iterable[LayerRule],
                   kernel_layers: Iterable[str]) -> Iterator[tuple[Any, Optional[str], bool]]:
    """Each layer of ``model`` with a verdict, as ``(layer, why it is not covered or None, whether
    its hook marks it seen)``; a judged layer's own parts (RoPE's rotation op) are part of its call,
    and other modules are containers whose layers are judged one by one."""
    judged = [(cls, rule) for rule in rules if (cls := _resolve(rule.base)) is not None]
    bases = tuple(cls for path in kernel_layers if (cls := _resolve(path)) is not None)
    pending = [model]
    while pending:
        module = pending.pop()
        method = getattr(module, "quant_method", None)
        rule = next((rule for cls, rule in judged if isinstance(method, cls)), None) if method is not None else None
        if method is not None and (rule is None or rule.problem is not by_layer_class):
            name = type(method).__name__
            if rule is not None:  # a quantization method a hook records (judged by the rule for it)
                yield module, rule.problem(module), True
                continue
            problem = None if name.startswith("Unquantized") else f"{type(module).__name__} with {name}"
            yield module, problem or _own_forward(module, name), name in ("UnquantizedLinearMethod",
                                                                           "UnquantizedEmbeddingMethod")
            continue
        rule = next((rule for cls, rule in judged if isinstance(module, cls)), None)
        if rule is not None and rule.container:
            yield module, rule.problem(module), False
            own = {id(child) for child in (rule.records(module) if rule.records else ()) if child is not None}
            pending.extend(reversed([child for child in module.children() if id(child) not in own]))
        elif rule is not None:
            yield module, rule.problem(module), True
        elif bases and isinstance(module, bases):
            yield module, f"{type(module).__name__} (a layer class no hook records)", False
        elif isinstance(module, TORCH_LAYERS) and _own_weights(module):
            yield module, f"{type(module).__name__} (a torch {_torch_base(module)} no hook records)", False
        elif _transformers_leaf(module):
            yield module, (f"{type(module).__name__} (transformers' own module, which an engine's Transformers "
                           "modeling backend runs as transformers wrote it: no hook records it)"), False
        elif _models_own_weighted_leaf(module):
            yield module, (f"{type(module).__name__} (a layer of the model's own code, {type(module).__module__}, "
                           "with weights of its own: no hook records it)"), False
        else:
            computes = computes_in_own_code(module)
            if computes:
                yield module, own_code_problem(module, computes), False
            pending.extend(reversed(list(module.children())))


def uncovered_layers(model: Any, rules: Iterable[LayerRule] = (), kernel_layers: Iterable[str] = ()) -> dict[str, int]:
    """Layers whose kernels no hook records, by kind, read once from the built model, so the record
    says what it misses instead of dropping it:

    - a layer with a quantization method other than the unquantized ones and those ``rules``
      judge (the methods a hook records, e.g. SGLang's block-scale FP8);
    - a layer that one of ``rules`` judges not covered (a RoPE, norm or attention class or
      configuration no Definition computes);
    - a layer of a kernel-layer base (``kernel_layers``: the engine's custom-op and attention
      bases) that no rule knows: a class no hook records, by its name;
    - one of torch's own layers with weights (:data:`TORCH_LAYERS`) that no rule knows."""
    return dict(Counter(problem for _, problem, _ in _judged_layers(model, rules, kernel_layers) if problem is not None))


def unseen_layers(model: Any, rules: Iterable[LayerRule] = ()) -> dict[str, int]:
    """Covered layers whose hook never saw a call, by class: the model has them, but their kernels
    ran past the hooked method (an engine path that calls a fused kernel with the layer's weights,
    say) and are not in the record. Read at the end of a run that ran steps."""
    found: Counter[str] = Counter()
    for module, problem, marked in _judged_layers(model, rules, ()):
        # a parameter, or a plain tensor (SGLang's RMSNorm without a weight holds ones, which its
        # fused q/k norm kernel is handed in its place)
        weight = module.__dict__.get("_parameters", {}).get("weight", module.__dict__.get("weight"))
        if problem is None and marked and not module.__dict__.get("_fi_profile_seen", False) and id(weight) not in SEEN_WEIGHTS:
            found[f"{type(module).__name__} (in the model, but no call of it reached its hook: its kernels ran "
                  "elsewhere, e.g. in a fused kernel, and are not in the record)"] += 1
    return dict(found)
