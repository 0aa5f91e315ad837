"""How layers that vLLM and SGLang share in shape (same class names, same attributes) turn into
op-table calls: norms, SwiGLU, RoPE, linear layers, lm_head, token embedding, the fused MoE call."""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch

from fi_profile.capture import ops

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


def require(problem: Optional[str]) -> None:
    """A hooked layer no Definition computes: its calls are lost, never recorded as another's."""
    if problem is not None:
        raise NotImplementedError(f"{problem}: not recorded (listed in run.not_covered)")


_RMSNORM = exact_class("RMSNorm")
silu_and_mul_problem = exact_class("SiluAndMul")


def rmsnorm_problem(layer: Any) -> Optional[str]:
    problem = _RMSNORM(layer)
    if problem is None and getattr(layer, "variance_size_override", None) is not None:
        return f"{type(layer).__name__} with variance_size_override (normalizes part of the hidden size)"
    return problem


def rmsnorm(self: Any, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> list:
    seen(self)
    require(rmsnorm_problem(self))
    return [ops.rmsnorm(x, residual, float(self.variance_epsilon))]


def silu_and_mul(self: Any, x: torch.Tensor) -> list:
    seen(self)
    require(silu_and_mul_problem(self))
    return [ops.silu_and_mul(x)]


#: the RoPE classes a Definition computes, and how each scales its frequencies (vLLM and SGLang
#: name them alike); YaRN, DeepSeek's YaRN, dynamic NTK, linear scaling, multimodal RoPE ... are
#: other computations and are not covered
ROPE_CLASSES = ("RotaryEmbedding", "Llama3RotaryEmbedding")


def rope_problem(layer: Any) -> Optional[str]:
    name = type(layer).__name__
    if name not in ROPE_CLASSES:
        return f"{name} (a RoPE no Definition computes)"
    if not layer.is_neox_style or layer.rotary_dim != layer.head_size:
        return (f"{name} with is_neox_style={layer.is_neox_style}, rotary_dim={layer.rotary_dim}, "
                f"head_size={layer.head_size} (only full-head NeoX-style RoPE has a Definition)")
    return None


def rope(self: Any, query: torch.Tensor, key: Optional[torch.Tensor] = None) -> list:
    """Tokens and heads from ``query`` (``positions`` is not read: while torch.compile traces,
    reading a graph input before the engine does would reorder the graph's inputs)."""
    seen(self)
    require(rope_problem(self))
    # heads from the static last dimensions (``[tokens, heads * head_size]`` or ``[..., heads,
    # head_size]``), never from the token count, which is a symbol while torch.compile traces
    num_q_heads = _heads(query, self.head_size)
    num_kv_heads = _heads(key, self.head_size) if key is not None else 0
    if type(self).__name__ == "Llama3RotaryEmbedding":  # its own attributes, no defaults: a renamed one is an error
        params = ops.RopeParams(theta=float(self.base), factor=float(self.scaling_factor),
                                low_freq_factor=float(self.low_freq_factor), high_freq_factor=float(self.high_freq_factor),
                                original_max_position=int(self.orig_max_position))
    else:  # unscaled: Llama-3 scaling with factor 1 is the identity
        params = ops.RopeParams(theta=float(self.base), factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position=8192)
    return [ops.rope(query, num_q_heads, num_kv_heads, self.head_size, params)]


def _heads(x: torch.Tensor, head_size: int) -> int:
    if x.dim() >= 3 and x.shape[-1] == head_size:  # [..., heads, head_size]
        return int(x.shape[-2])
    return int(x.shape[-1] // head_size)  # [tokens, heads * head_size]


def gemm_size(layer: Any) -> tuple[int, int]:
    """A linear layer's logical ``(N, K)`` on this rank, from the sizes the layer declares.

    Never from ``layer.weight``: backends repack it (vLLM on CPUs with AVX-512 BF16 hands it to
    oneDNN or its own kernel and leaves an empty tensor; SGLang packs it for AMX), quantized
    methods store it packed or transposed, and its shape then says nothing about the GEMM."""
    if hasattr(layer, "num_embeddings_per_partition") and hasattr(layer, "embedding_dim"):  # lm_head
        return int(layer.num_embeddings_per_partition), int(layer.embedding_dim)
    n = getattr(layer, "output_size_per_partition", None)
    if n is None:
        sizes = getattr(layer, "output_partition_sizes", None)
        n = sum(sizes) if sizes else getattr(layer, "output_size", None)
    k = getattr(layer, "input_size_per_partition", None) or getattr(layer, "input_size", None)
    if n is None or k is None:
        raise NotImplementedError(
            f"{type(layer).__name__}: declares no logical sizes (output_size[_per_partition], input_size[_per_partition])"
        )
    return int(n), int(k)


def linear(self: Any, layer: Any, x: torch.Tensor) -> list:
    seen(layer)
    if getattr(layer, "_fi_profile_recorded_by", None) is not None:  # a MoE router its MoE call records
        return []
    return [ops.gemm(x, *gemm_size(layer))]


def lm_head(self: Any, lm_head: Any, hidden_states: torch.Tensor) -> list:
    """The logits projection (vLLM and SGLang name these arguments alike, in different orders)."""
    seen(self, lm_head)
    return [ops.gemm(hidden_states, *gemm_size(lm_head))]


def embedding(self: Any, input_: torch.Tensor) -> list:
    seen(self)
    dtype = self.weight.dtype  # an emptied or repacked table keeps its dtype; a quantized one would not
    if not dtype.is_floating_point:
        raise NotImplementedError(f"{type(self).__name__}: {dtype} embedding table (quantized): no Definition")
    return [ops.embedding(input_, int(self.num_embeddings_per_partition), int(self.embedding_dim), dtype)]


def moe(hidden_states: torch.Tensor, router_logits: torch.Tensor, unsupported: Mapping[str, bool], *,
        num_experts: int, top_k: int, intermediate_size: int, renormalize: bool) -> list:
    """A MoE layer (routing + SwiGLU experts) as one fused call; ``unsupported`` names the
    features an engine's layer may have that no MoE Definition computes (raised, so the hook
    error says which)."""
    problems = [what for what, applies in unsupported.items() if applies]
    if problems:
        raise NotImplementedError(f"MoE layer without a Definition: {', '.join(problems)}")
    return [ops.moe(hidden_states, router_logits, num_experts=num_experts, top_k=top_k,
                    intermediate_size=intermediate_size, renormalize=renormalize)]


@dataclass(frozen=True)
class LayerRule:
    """Layers of ``base`` (``module:Class``, or every instance of its subclasses) are judged by
    ``problem``: why one is not covered, or None."""

    base: str
    problem: Callable[[Any], Optional[str]]


def _resolve(path: str) -> Optional[type]:
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - an engine version without it: nothing of it to judge
        return None


def _judged_layers(model: Any, rules: Iterable[LayerRule],
                   kernel_layers: Iterable[str]) -> Iterator[tuple[Any, Optional[str], bool]]:
    """Each layer of ``model`` with a verdict, as ``(layer, why it is not covered or None, whether
    its hook marks it seen)``; a judged layer's own parts (RoPE's rotation op) are part of its call,
    and other modules are containers whose layers are judged one by one."""
    judged = [(cls, rule.problem) for rule in rules if (cls := _resolve(rule.base)) is not None]
    bases = tuple(cls for path in kernel_layers if (cls := _resolve(path)) is not None)
    pending = [model]
    while pending:
        module = pending.pop()
        method = getattr(module, "quant_method", None)
        if method is not None:
            name = type(method).__name__
            problem = None if name.startswith("Unquantized") else f"{type(module).__name__} with {name}"
            yield module, problem, name in ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
            continue
        rule = next((problem for cls, problem in judged if isinstance(module, cls)), None)
        if rule is not None:
            yield module, rule(module), True
        elif bases and isinstance(module, bases):
            yield module, f"{type(module).__name__} (a layer class no hook records)", False
        else:
            pending.extend(reversed(list(module.children())))


def uncovered_layers(model: Any, rules: Iterable[LayerRule] = (), kernel_layers: Iterable[str] = ()) -> dict[str, int]:
    """Layers whose kernels no hook records, by kind, read once from the built model, so the record
    says what it misses instead of dropping it:

    - a layer with a quantization method other than the unquantized ones (the hooks see those
      only; quantized weights have no Definition here);
    - a layer that one of ``rules`` judges not covered (a RoPE, norm or attention class or
      configuration no Definition computes);
    - a layer of a kernel-layer base (``kernel_layers``: the engine's custom-op and attention
      bases) that no rule knows: a class no hook records, by its name."""
    return dict(Counter(problem for _, problem, _ in _judged_layers(model, rules, kernel_layers) if problem is not None))


def unseen_layers(model: Any, rules: Iterable[LayerRule] = ()) -> dict[str, int]:
    """Covered layers whose hook never saw a call, by class: the model has them, but their kernels
    ran past the hooked method (an engine path that calls a fused kernel with the layer's weights,
    say) and are not in the record. Read at the end of a run that ran steps."""
    found: Counter[str] = Counter()
    for module, problem, marked in _judged_layers(model, rules, ()):
        weight = module.__dict__.get("_parameters", {}).get("weight")
        if problem is None and marked and not module.__dict__.get("_fi_profile_seen", False) and id(weight) not in SEEN_WEIGHTS:
            found[f"{type(module).__name__} (in the model, but no call of it reached its hook: its kernels ran "
                  "elsewhere, e.g. in a fused kernel, and are not in the record)"] += 1
    return dict(found)
