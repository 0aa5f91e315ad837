"""SGLang's Gemma-3 (``sglang.srt.models.gemma3_causal``), which runs two computations of its own
off its AMX CPU path:

- its token embedding, ``Gemma3TextScaledWordEmbedding``: torch's ``nn.Embedding`` (unsharded),
  then times the model's scale (an elementwise op no Definition has, as vLLM's ``normalizer``
  multiply after its embedding);
- Hugging Face's RoPE. Each forward computes cos/sin for its tokens from two tables of the model's
  (``Gemma3RotaryEmbedding``: ``rotary_emb`` for the global layers, with their scaling,
  ``rotary_emb_local`` for the sliding ones), and each layer rotates q and k with them
  (``apply_rotary_pos_emb``). The attention layers' own ``rotary_emb`` (SGLang's RotaryEmbedding,
  built without the global layers' scaling) runs on the AMX path only, where its own hook records it.

Which table a rotation used is the decoder layer's: its ``is_sliding``, set while it runs.

Its decoder layer, where its ``forward`` takes no ``residual`` (SGLang 0.5.16; later versions pass
the residual to fused norms), adds each residual in Python between two norms: ``norm → residual +
h → norm``, the math of ``gemma_fused_add_rmsnorm_*``, as later versions run it. The add (a kernel
of its own, which no Definition computed: 0.7% of Gemma-3-27B's time) and the norm that takes its
sum are then one call of that Definition: the add feeds the norm's call (its kernels and graph
nodes are the call's), and the record has the counts a version with the fused norms gives.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode

from fi_profile.capture.graph_capture import CAPTURING
from fi_profile.capture.layers import judged_once, require, seen
from fi_profile.capture.patching import wrap
from fi_profile.capture.recorder import RECORDER
from fi_profile.families import embedding, rmsnorm, rope

#: the model and the decoder layer that run now (the hooks below set them around their forwards)
_CURRENT = threading.local()
#: the tables' rope types a Definition computes: cos/sin of the positions (divided by a linear factor)
TABLE_TYPES = ("default", "linear")


@contextlib.contextmanager
def _current(**values: Any) -> Iterator[None]:
    before = {name: getattr(_CURRENT, name, None) for name in values}
    for name, value in values.items():
        setattr(_CURRENT, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(_CURRENT, name, value)


def model_forward(self: Any) -> Any:
    """``Gemma3TextModel.forward``: its two RoPE tables, the global one first, and its layers (no
    residual sum waiting for its norm yet)."""
    return _current(tables=(getattr(self, "rotary_emb", None), getattr(self, "rotary_emb_local", None)),
                    layers=getattr(self, "layers", None), residual_sum=None)


def decoder_layer_forward(self: Any, hidden_states: torch.Tensor) -> Any:
    """``Gemma3DecoderLayer.forward``: whether its attention is a sliding layer's, and its RoPE
    layer; where the layer adds its residuals in Python, those adds are watched while it runs."""
    attention = getattr(self, "self_attn", None)
    current = _current(sliding=getattr(self, "is_sliding", None), layer_rope=getattr(attention, "rotary_emb", None))
    if not adds_residual_in_python(type(self)) or torch.compiler.is_compiling() \
            or not (RECORDER.active or CAPTURING.trace is not None):
        return current
    stack = contextlib.ExitStack()
    stack.enter_context(current)
    stack.enter_context(ResidualAdds(hidden_states))
    return stack


@functools.lru_cache(maxsize=None)
def adds_residual_in_python(layer_class: type) -> bool:
    """Whether the decoder layer's ``forward`` takes no ``residual`` (SGLang 0.5.16's: it adds the
    residuals itself; later versions pass the residual to their norms, which fuse the add)."""
    try:
        return "residual" not in inspect.signature(layer_class.forward).parameters
    except (TypeError, ValueError):
        return False


def _add(func: Any, stream: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    return func(stream, branch)


def _records_nothing() -> list:
    return []


#: a residual add: recording nothing of its own, its kernels (and graph nodes) the next norm call's
_fed_add = wrap(_add, "gemma3_residual_add", _records_nothing, feeds=rmsnorm.KEY)
#: how a residual add is called: ``residual + hidden_states``, or torch's add (compared by identity:
#: every torch call in the layer passes here, and nothing of it may raise)
_ADDS = (torch.Tensor.__add__, torch.Tensor.add, torch.add)


class ResidualAdds(TorchFunctionMode):
    """While a decoder layer runs: each add of the residual stream (the layer's input, then each
    sum) and a tensor of its shape is a residual add; its sum, the branch added and the residual
    before it wait for the norm that takes the sum (:func:`norm_calls`), past the layer's end."""

    def __init__(self, stream: torch.Tensor) -> None:
        super().__init__()
        self.stream = stream

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if (func is _ADDS[0] or func is _ADDS[1] or func is _ADDS[2]) and not kwargs and len(args) == 2:
            first, second = args
            if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and first.shape == second.shape \
                    and (first is self.stream or second is self.stream):
                branch = second if first is self.stream else first
                total = _fed_add(func, first, second)
                _CURRENT.residual_sum = (total, branch, self.stream)
                self.stream = total
                return total
        return func(*args, **(kwargs or {}))


def norm_calls(self: Any, x: torch.Tensor, residual: Optional[torch.Tensor] = None,
               post_residual_addition: Optional[torch.Tensor] = None) -> list:
    """SGLang's Gemma norms: as :func:`fi_profile.families.rmsnorm.gemma_layer_calls`, but a norm of
    a residual sum its decoder layer made in Python (:class:`ResidualAdds`) is the fused add + norm
    of the branch and the residual before it."""
    waiting = getattr(_CURRENT, "residual_sum", None)
    if residual is None and waiting is not None and x is waiting[0]:
        _CURRENT.residual_sum = None
        x, residual = waiting[1], waiting[2]
    return rmsnorm.gemma_layer_calls(self, x, residual, post_residual_addition)


def rotation_calls(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> list:
    """``apply_rotary_pos_emb(q, k, cos, sin)`` in Gemma-3's attention: one position per token (a
    row of ``cos``, ``[..., tokens, head_dim]``), the heads what ``q`` and ``k`` hold besides (their
    layout differs between versions: ``[tokens, heads, d]`` or ``[1, heads, tokens, d]``)."""
    tables, sliding = getattr(_CURRENT, "tables", None), getattr(_CURRENT, "sliding", None)
    if tables is None or sliding is None:
        raise NotImplementedError("apply_rotary_pos_emb outside Gemma3TextModel's decoder layers: which RoPE "
                                  "table it rotates by is not known")
    table = tables[1] if sliding else tables[0]
    if table is None:
        raise NotImplementedError("Gemma3TextModel without rotary_emb/rotary_emb_local: its RoPE is not known")
    seen(table, getattr(_CURRENT, "layer_rope", None))
    require(judged_once(table, table_problem))
    head_dim = int(cos.shape[-1])
    tokens = cos.numel() // head_dim
    return [rope.call(q, q.numel() // (tokens * head_dim), k.numel() // (tokens * head_dim), head_dim,
                      table_params(table))]


def table_prologue_calls(self: Any, x: torch.Tensor) -> list:
    """``Gemma3RotaryEmbedding.forward``: the cos/sin that each forward computes from a table for
    its tokens (Hugging Face's: a matmul of the positions and inverse frequencies, cos, sin) are
    the rotation's inputs, so its kernels are the RoPE Definition's of the layers that rotate by
    this table (the global one: the layers that are not sliding). That Definition is made as the
    first such layer's rotation makes it, from its attention's heads on this rank; none where no
    layer takes the table, or the table is not one a Definition computes (its layer rule says so)."""
    tables, layers = getattr(_CURRENT, "tables", None), getattr(_CURRENT, "layers", None)
    if tables is None or layers is None or self not in tables or judged_once(self, table_problem) is not None:
        return []
    sliding = self is tables[1] and tables[0] is not tables[1]
    for layer in layers:
        attention = getattr(layer, "self_attn", None)
        if attention is not None and bool(getattr(layer, "is_sliding", False)) == sliding:
            return [rope.call(x, int(attention.num_heads), int(attention.num_kv_heads), int(attention.head_dim),
                              table_params(self))]
    return []


def table_params(table: Any) -> rope.RopeParams:
    """A table's constants: its theta, and the linear factor of a ``linear`` one."""
    parameters = table.config.rope_parameters
    factor = float(parameters["factor"]) if table.rope_type == "linear" else 1.0
    return rope.RopeParams(theta=float(parameters["rope_theta"]), linear_factor=factor)


def table_problem(table: Any) -> Optional[str]:
    """Why a ``Gemma3RotaryEmbedding`` is not what the RoPE Definitions compute, or None: a rope type
    other than the plain and linear ones, a magnitude (attention scaling), or inverse frequencies that
    are not its constants' (its own ``rope_init_fn`` run again on the CPU: nothing of the GPU is
    read, so this may run while a CUDA graph is captured)."""
    name = type(table).__name__
    rope_type = getattr(table, "rope_type", None)
    if rope_type not in TABLE_TYPES:
        return f"{name} with rope_type {rope_type!r} (only {', '.join(TABLE_TYPES)} have a Definition)"
    try:
        params = table_params(table)
        inv_freq, scaling = table.rope_init_fn(table.config, torch.device("cpu"))
    except Exception as exc:  # noqa: BLE001 - an attribute this version names otherwise
        return f"{name} whose constants cannot be read ({type(exc).__name__}: {exc})"
    if float(scaling) != 1.0:
        return f"{name} with attention scaling {float(scaling):g} (no RoPE Definition scales cos/sin)"
    dim = 2 * inv_freq.numel()
    expected = 1.0 / (params.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)) / params.linear_factor
    if not torch.allclose(inv_freq.float().cpu(), expected, rtol=1e-5, atol=0):
        return f"{name} whose inverse frequencies are not its constants' ({params}: an attribute fi-profile does not know)"
    return None


def embedding_calls(self: Any, input_ids: torch.Tensor) -> list:
    """``Gemma3TextScaledWordEmbedding.forward``: torch's embedding over the whole table."""
    seen(self)
    require(embedding_problem(self))
    return [embedding.call(input_ids, int(self.num_embeddings), int(self.embedding_dim), self.weight.dtype)]


def embedding_problem(layer: Any) -> Optional[str]:
    dtype = layer.weight.dtype
    return None if dtype.is_floating_point else f"{type(layer).__name__} with a {dtype} table (quantized): no Definition"
