"""Values of single inputs, by dtype and by the role their name gives them.

Index structure (indptr, indices, last-page lengths) is :mod:`fi_profile.synthesis.layout`'s job;
this module fills the data: random floats of any dtype (fp8/fp4 included), probabilities,
positions, token ids, top-k/top-p parameters, and default scalars.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import torch

from fi_profile.families import family_of
from fi_profile.schema.definition import Definition, TensorSpec
from fi_profile.schema.dtype import DType, torch_dtype

#: Values for scalar (shape null) inputs that a workload does not give.
_DEFAULT_SCALARS: dict[str, float] = {"eps": 1e-6, "rms_eps": 1e-6}


def default_scalar(name: str, spec: TensorSpec, definition: Definition) -> Any:
    if name == "sm_scale":
        dim = definition.const_axes.get("head_dim") or definition.const_axes.get("head_size")
        if dim:
            return 1.0 / math.sqrt(dim)
    if spec.dtype is DType.bool:
        return False
    if spec.dtype.is_float:
        return _DEFAULT_SCALARS.get(name, 1.0)
    return 0


def tensor_value(
    name: str,
    spec: TensorSpec,
    shape: tuple[int, ...],
    definition: Definition,
    axes: Mapping[str, int],
    gen: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """A valid random tensor for input ``name`` of logical ``shape``: its op family's values where
    the family gives them (:attr:`~fi_profile.families.family.Family.input_values`), else by name and dtype."""
    dtype = torch_dtype(spec.dtype)
    family = family_of(definition.op_type)
    if family is not None:
        value = family.input_values(name, shape, definition, gen, device, dtype)
        if value is not None:
            return value
    if name == "probs":
        logits = torch.randn(shape, generator=gen, device=device) * 3
        return logits.softmax(dim=-1).to(dtype)
    if name == "top_k":
        vocab = axes.get("vocab_size", 64)
        return torch.randint(1, min(vocab, 64) + 1, shape, generator=gen, device=device).to(dtype)
    if name == "top_p":
        return (0.1 + 0.9 * torch.rand(shape, generator=gen, device=device)).to(dtype)
    if name == "positions":
        bound = _position_bound(definition, axes)
        return torch.randint(0, bound, shape, generator=gen, device=device).to(dtype)
    if name in ("input_ids", "token_ids"):
        bound = axes.get("vocab_size", 2)
        return torch.randint(0, bound, shape, generator=gen, device=device).to(dtype)
    if name == "sinks":
        # attention sinks: one logit per query head, U(-1, 5). Random queries and keys give logits
        # of about unit variance, so a sink then takes from a few percent to most of a head's
        # attention over tens to hundreds of keys, as trained sinks do (gpt-oss's)
        return (torch.rand(shape, generator=gen, device=device) * 6 - 1).to(dtype)
    slots = _slot_indices(name, shape, definition, axes, gen)
    if slots is not None:
        return slots.to(device=device, dtype=dtype)
    if spec.dtype is DType.bool:
        return torch.rand(shape, generator=gen, device=device) < 0.5
    if spec.dtype.is_packed:
        packed = shape[:-1] + (shape[-1] // 2,)
        return torch.randint(0, 256, packed, generator=gen, device=device, dtype=torch.uint8).view(dtype)
    data = _microscaled(name, definition)
    if data is not None and spec.dtype is DType.int8:
        return _e8m0_scales(shape, axes.get(data.shape[-1], 1) if data.shape else 1, gen, device)
    if not spec.dtype.is_float:
        fill = 1 if name.endswith(("_len", "_lens", "lengths")) else 0
        return torch.full(shape, fill, dtype=dtype, device=device)
    if "scale" in name:  # scale factors are positive and near 1, or what an FP8 tensor's take
        return ((0.5 + torch.rand(shape, generator=gen, device=device)) * _fp8_scale(name, definition, axes)).to(dtype)
    if spec.dtype in _FP8 and _static_scale(name, definition):
        # FP8 data divided by a static per-tensor scale given beforehand (an FP8 KV cache, queries
        # before attention: the engines' default 1.0): O(1) values, not the format's whole range
        return _normal(shape, gen, device, dtype, bound=_FP8[spec.dtype])
    if spec.dtype in _FP8:  # quantized data spans the format's range, as a quantizer leaves it
        return _normal(shape, gen, device, dtype, _FP8[spec.dtype] / _FP8_SPREAD, bound=_FP8[spec.dtype])
    if _is_weight(name) and len(shape) >= 2 and shape[-1] > 0:
        # weight matrices as models initialise them (std 1/sqrt(fan-in)): activations stay O(1)
        # through chained GEMMs (MoE experts), so low-precision rounding stays within tolerance
        return _normal(shape, gen, device, dtype, 1 / math.sqrt(shape[-1]))
    return _normal(shape, gen, device, dtype)


def _slot_indices(name: str, shape: tuple[int, ...], definition: Definition, axes: Mapping[str, int],
                  gen: torch.Generator) -> Optional[torch.Tensor]:
    """Integer inputs that pick slots of another input, by the role their name gives them (None:
    not one of them). Filled with zeros, every request would share one slot and every token one
    key: a kernel timed on that reads one cache line, and one that writes a slot races.

    - ``X_indices`` / ``X_batch_indices``: each request's slot of the pool ``X`` (Mamba's
      ``state_batch_indices``, the GDN MTP's ``initial_state_indices``), distinct;
    - ``sparse_indices``: each token's ``topk`` keys of a paged cache (DeepSeek-V3.2's sparse
      attention: ``page * page_size + offset``), distinct per token, ``-1`` past the cache's size;
    - ``block_table``: each request's pages of the cache (distinct within a request, and across
      requests where the cache holds them all) and ``seq_lens`` beside it, of at least one token
      and at most its pages' worth (the DSA indexer's)."""
    stem = name.removesuffix("_indices").removesuffix("_batch")
    if name.endswith("_indices") and name != "kv_indices" and stem in definition.inputs and len(shape) == 1:
        pool_shape = definition.inputs[stem].shape
        pool = axes[pool_shape[0]] if pool_shape else 0
        if pool < shape[0]:
            return None  # no distinct slots for every request: its constraint says so
        return torch.randperm(pool, generator=gen)[: shape[0]]
    if name == "sparse_indices" and len(shape) == 2:
        cache = next((definition.inputs[c].shape for c in ("ckv_cache", "k_cache", "kv_cache")
                      if c in definition.inputs and definition.inputs[c].shape), None)
        if cache is None or len(cache) < 2:
            return None
        keys = axes[cache[0]] * axes[cache[1]]
        rows = [torch.randperm(keys, generator=gen)[: shape[1]] for _ in range(shape[0])]
        out = torch.full(shape, -1, dtype=torch.int64)
        for i, row in enumerate(rows):
            out[i, : row.numel()] = row
        return out
    if name == "block_table" and len(shape) == 2:
        pages = _pages_of(definition, axes)
        if not pages:
            return None
        if pages >= shape[0] * shape[1]:
            return torch.randperm(pages, generator=gen)[: shape[0] * shape[1]].reshape(shape)
        # a request's pages distinct as far as the cache has them (its length stays within those)
        rows = [torch.randperm(pages, generator=gen).repeat(-(-shape[1] // pages))[: shape[1]] for _ in range(shape[0])]
        return torch.stack(rows)
    if name == "seq_lens" and "block_table" in definition.inputs and "page_size" in axes:
        table = definition.inputs["block_table"].shape
        if not table or len(table) != 2:
            return None
        most = min(axes[table[1]], _pages_of(definition, axes) or axes[table[1]]) * axes["page_size"]
        return torch.randint(1, max(1, most) + 1, shape, generator=gen)
    return None


def _pages_of(definition: Definition, axes: Mapping[str, int]) -> Optional[int]:
    """The pages of the paged cache a Definition reads (its first dimension), or ``num_pages``."""
    for spec in definition.inputs.values():
        if spec.shape and len(spec.shape) >= 3 and spec.shape[0] == "num_pages":
            return axes["num_pages"]
    return axes.get("num_pages")


#: FP8 formats -> their largest finite value; quantized data is drawn with that over this as its
#: standard deviation (a group's largest of 128 normal values is about 3 of them: within range)
_FP8 = {DType.float8_e4m3fn: 448.0, DType.float8_e5m2: 57344.0}
_FP8_SPREAD = 4.0


def _static_scale(name: str, definition: Definition) -> bool:
    """Whether FP8 input ``name`` has a static per-tensor scale, a scalar input named after it
    (``q`` -> ``q_scale``, ``k_cache`` -> ``k_scale``), or one scale of a cache of several parts
    (``ckv_cache`` and ``kpe_cache`` -> ``kv_scale``: MLA's latent cache)."""
    scales = (definition.inputs.get(f"{name}_scale"), definition.inputs.get(f"{name.removesuffix('_cache')}_scale"),
              definition.inputs.get("kv_scale") if name.endswith("_cache") else None)
    return any(scale is not None and scale.shape is None for scale in scales)


#: the E2M1 codes' values' standard deviation over uniformly random codes (sqrt(137 / 16))
_E2M1_STD = math.sqrt(137 / 16)


def _microscaled(name: str, definition: Definition) -> Optional[TensorSpec]:
    """The FP4 tensor whose block scales input ``name`` holds (``gemm1_scales`` -> ``gemm1_weights``,
    or ``X_scales`` -> ``X``), or None."""
    if not name.endswith("_scales"):
        return None
    stem = name.removesuffix("_scales")
    for candidate in (f"{stem}_weights", f"{stem}_weight", stem):
        spec = definition.inputs.get(candidate)
        if spec is not None and spec.dtype is DType.float4_e2m1:
            return spec
    return None


def _e8m0_scales(shape: tuple[int, ...], fan_in: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """MXFP4 block scales as E8M0 bytes (2^(s - 127), stored as int8): random codes times them have
    the standard deviation of a weight matrix as models initialise it (1/sqrt(fan-in)), each block's
    exponent one either side of it, as trained blocks differ."""
    exponent = round(math.log2(1 / (_E2M1_STD * math.sqrt(max(1, fan_in)))))
    codes = 127 + exponent + torch.randint(-1, 2, shape, generator=gen, device=device)
    return codes.clamp(0, 254).to(torch.uint8).view(torch.int8)


def _is_weight(name: str) -> bool:
    return name.endswith(("weight", "weights")) or name == "B"


def _fp8_scale(name: str, definition: Definition, axes: Mapping[str, int]) -> float:
    """The magnitude of the scale of an FP8 input ``X`` (named ``X_scale``): its dequantized values
    get the standard deviation the same tensor has unquantized (1 for activations, 1/sqrt(fan-in)
    for weights). 1 for any other scale."""
    data = definition.inputs.get(name.removesuffix("_scale"))
    if data is None or data.dtype not in _FP8 or not data.shape:
        return 1.0
    std = 1 / math.sqrt(max(1, axes.get(data.shape[-1], 1))) if _is_weight(name.removesuffix("_scale")) else 1.0
    return std * _FP8_SPREAD / _FP8[data.dtype]


#: elements above which a normal tensor is drawn a slice at a time (1 GiB of float32)
_SLICE = 1 << 28


def _normal(shape: tuple[int, ...], gen: torch.Generator, device: torch.device, dtype: torch.dtype,
            scale: float = 1.0, bound: float = math.inf) -> torch.Tensor:
    """Standard normal values times ``scale`` (within ±``bound``) in ``dtype``. A large tensor
    (DeepSeek-V3's expert weights: 15 GiB in bf16) is drawn a slice of its first dimension at a
    time, so that no float32 copy of all of it is ever held."""

    def draw(part_shape: tuple[int, ...]) -> torch.Tensor:
        values = torch.randn(part_shape, generator=gen, device=device) * scale
        return values.clamp(-bound, bound) if bound < math.inf else values

    numel = math.prod(shape)
    if numel <= _SLICE or len(shape) < 2:
        return draw(shape).to(dtype)
    out = torch.empty(shape, dtype=dtype, device=device)
    rows = max(1, _SLICE // math.prod(shape[1:]))
    for start in range(0, shape[0], rows):
        part = out[start : start + rows]
        part.copy_(draw(part.shape))
    return out


def _position_bound(definition: Definition, axes: Mapping[str, int]) -> int:
    cache = definition.inputs.get("cos_sin_cache")
    if cache is not None and cache.shape:
        return axes[cache.shape[0]]
    return axes.get("max_position", axes.get("max_seq_len", 4096))
