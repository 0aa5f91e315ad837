"""Gated DeltaNet (Qwen3-Next's linear attention), op type ``gdn``: flashinfer-trace's
``gdn_decode_*`` and ``gdn_prefill_*`` Definitions (``qk{H}_v{HV}_d{D}_k_last``, heads per rank),
the calls a layer makes of them in a step, their PyTorch baselines, and the inputs their recurrence
needs to stay what a model feeds it.

A step's decode requests (one token each) are one ``gdn_decode_*`` call, its prefill requests one
``gdn_prefill_*`` call over their ``cu_seqlens`` (kept as a workload tensor); each takes the gates
raw (``A_log``, ``a``, ``dt_bias``, ``b``) and the requests' states gathered, and gives the new
ones. The dataset's references take query and key as the recurrence uses them, unit vectors: the
engines normalize them in their kernels (``use_qk_l2norm_in_kernel``) before the delta rule, and a
key of norm √128 makes the rule's ``I - beta k k^T`` grow the state by about 128 at every token.
The causal conv1d the engines run before it is the ``causal_conv1d`` family's.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.kernel_call import KernelCall, cached_definition
from fi_profile.families import engine_kernels
from fi_profile.families.family import Baseline, Family, Native
from fi_profile.schema.definition import Definition
from fi_profile.schema.dtype import DType, schema_dtype

KEY = "gdn"

#: the decay rate A = exp(A_log) and the step dt = softplus(dt_bias) a Gated DeltaNet or Mamba-2 layer
#: is initialized with (Qwen3-Next's, after Mamba-2's): A ~ U(1, 16), dt log-uniform in [1e-3, 1e-1]
A_RANGE = (1.0, 16.0)
DT_RANGE = (1e-3, 1e-1)


def input_values(name: str, shape: tuple[int, ...], definition: Definition, gen: torch.Generator,
                 device: torch.device, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The inputs whose range the recurrence depends on; None for the rest (normal values: the
    projections ``a``, ``b`` and ``v``, and a state of unit-scale entries, which maps a unit key to a
    vector of the size of a value)."""
    if name in ("q", "k"):  # unit vectors per head, as the engines' kernels make them
        x = torch.randn(shape, generator=gen, device=device)
        return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(dtype)
    if name == "A_log":
        low, high = A_RANGE
        return torch.log(low + (high - low) * torch.rand(shape, generator=gen, device=device)).to(dtype)
    if name == "dt_bias":  # softplus^-1(dt)
        low, high = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
        dt = torch.exp(low + (high - low) * torch.rand(shape, generator=gen, device=device))
        return (dt + torch.log(-torch.expm1(-dt))).to(dtype)
    return None


#: the dataset's Definitions of Qwen3-Next at TP=4, instantiated for other head counts
_TEMPLATES = {"decode": "gdn_decode_qk4_v8_d128_k_last", "prefill": "gdn_prefill_qk4_v8_d128_k_last"}
#: the head size the dataset's references are written for (``assert K == 128 and V == 128``)
HEAD_SIZE = 128


def layer_problem(heads: int, v_heads: int, head_k: int, head_v: int, dtype: Optional[torch.dtype] = None
                  ) -> Optional[str]:
    """Why a Gated DeltaNet layer of these sizes (per rank; activations of ``dtype``, where known)
    is no ``gdn_*`` Definition's, or None."""
    if head_k != HEAD_SIZE or head_v != HEAD_SIZE:
        return (f"Gated DeltaNet with key/value heads of {head_k}/{head_v} (flashinfer-trace's gdn references are "
                f"written for {HEAD_SIZE})")
    if v_heads % heads:
        return f"Gated DeltaNet with {v_heads} value heads over {heads} key heads (not a whole number per key head)"
    if dtype is not None and schema_dtype(dtype) is not DType.bfloat16:
        return f"Gated DeltaNet on {dtype} activations (the gdn Definitions take bfloat16)"
    return None


def _definition(kind: str, heads: int, v_heads: int) -> Definition:
    name = f"gdn_{kind}_qk{heads}_v{v_heads}_d{HEAD_SIZE}_k_last"
    return cached_definition(("gdn", kind, heads, v_heads), lambda: definition_for(
        _TEMPLATES[kind], name, {"num_q_heads": heads, "num_k_heads": heads, "num_v_heads": v_heads,
                                 "head_size": HEAD_SIZE}, DType.bfloat16))


def step_calls(heads: int, v_heads: int, decodes: int, prefill_starts: Optional[torch.Tensor]) -> list[KernelCall]:
    """A layer's calls in a step: its ``decodes`` one-token requests as one decode call, and the
    prefill requests whose query starts are ``prefill_starts`` (host, from 0; None: none) as one
    prefill call. The scale is the references' default, 1/√head (the engines' too)."""
    scalars = {"scale": HEAD_SIZE ** -0.5}
    calls = []
    if decodes:
        calls.append(KernelCall(_definition("decode", heads, v_heads), {"batch_size": decodes}, scalars=scalars))
    if prefill_starts is not None and len(prefill_starts) > 1:
        starts = prefill_starts.to(torch.int64)
        calls.append(KernelCall(_definition("prefill", heads, v_heads),
                                {"total_seq_len": int(starts[-1]), "num_seqs": len(starts) - 1,
                                 "len_cu_seqlens": len(starts)},
                                tensors={"cu_seqlens": starts}, scalars=scalars))
    return calls


def _chunked(definition: Definition) -> bool:
    return definition.name.startswith("gdn_prefill_")


def _output_read_from_state(definition: Definition) -> dict[str, str]:
    """A chunked prefill reads each chunk's output from its chunk-start state, rounded to the
    activations' dtype: the output's rounding is the state's magnitude's, where larger than its own.
    Seen on an H100 (vLLM 0.26's FLA prefill, Qwen3-Next at TP=4): 1 of 2.3M outputs 0.0103 off
    where the reference is 7e-6, beyond bfloat16's 0.01."""
    return {"output": "new_state"} if _chunked(definition) else {}


def _rounds_through(definition: Definition) -> Optional[torch.dtype]:
    """The engines' kernels carry the state through values rounded to the activations' dtype, which
    the reference keeps in float32: a chunked prefill (flash-linear-attention's, FlashInfer's) its
    chunk-to-chunk products (the chunk's inverted triangular system, its ``w`` and ``u``); SGLang's
    packed decode its update's gate (``sigmoid(b)`` cast to ``b``'s dtype: each new state 0.0025
    off at magnitude 5 on an H100, Qwen3-Next at TP=4). The activations' precision bounds the check
    of the state and output: a prefill's times their largest magnitude (``atol_of_largest``), as
    its rounded products compound over the chunks; a decode step's as it is (one rounded gate: a
    gate 0.5% off still fails)."""
    spec = definition.inputs.get("v")
    return torch.float16 if spec is not None and spec.dtype is DType.float16 else torch.bfloat16


#: where vLLM keeps its copy of flash-linear-attention's kernels (Triton: CUDA only), by version
_VLLM_FLA = ("vllm.third_party.flash_linear_attention.ops", "vllm.model_executor.layers.fla.ops")


#: SGLang's copy of them: its packed decode, and its gating kernel before its chunked prefill (0.5.16)
_SGLANG_FLA = {"decode": "sglang.kernels.ops.attention.fla.fused_recurrent",
               "prefill": "sglang.kernels.ops.attention.fla.fused_gdn_gating"}


def _natives(definition: Definition, fitted: Optional[str]) -> list[Native]:
    """The engines' Triton kernels: vLLM's fused gating + recurrence for decode and its chunked rule
    for prefill; SGLang's packed decode and its gating + chunked rule, updating the requests' states
    in place as it does (FlashInfer's GDN kernels are not offered: its prefill needs the CuTe DSL
    package)."""
    for kind in ("decode", "prefill"):  # not the dataset's multi-token gdn_mtp_* (no capture makes them yet)
        if definition.name.startswith(f"gdn_{kind}_"):
            return [Native("vllm", f"vllm_gdn_{kind}.py", requires=_VLLM_FLA),
                    Native("sglang", f"sglang_gdn_{kind}.py", requires=_SGLANG_FLA[kind],
                           overwrites=lambda d: {"state": "new_state"})]
    return []


FAMILY = Family(
    key=KEY,
    package=__name__,
    op_types=("gdn",),
    templates=tuple(_TEMPLATES.values()),
    baselines=(Baseline("torch_gdn_decode.py"),
               # a Python loop over the positions, as many as the longest sequence: not compiled
               Baseline("torch_gdn_prefill.py", compiled=False)),
    # FLA's Triton kernels (vLLM's and SGLang's vendored copies) and FlashInfer's: never a GEMM's; vLLM
    # 0.3x's prefill prologue (gates, L2 norms: ``_fused_post_conv_kernel``) and FLA's ``l2norm_fwd_kernel``;
    # the chunked prefill's triangular inverse (``merge_16x16_to_64x64_inverse_kernel``) and output
    # (``chunk_fwd_kernel_o``), named after no op; ``dot_kkt`` outweighs the attention families' ``fwd``
    # in ``chunk_scaled_dot_kkt_fwd_kernel`` (``kkt`` tied with it, and the chunked kernels went unattributed)
    kernel_words=("gated_delta", "delta_rule", "gdn", "solve_tril", "dot_kkt", "recompute_w_u", "chunk_local_cumsum",
                  "fused_post_conv", "l2norm_fwd", "merge_16x16", "chunk_fwd_kernel_o"),
    # SGLang's GDN backend copies each request's states to its prefix cache's track slot, after the
    # recurrence and inside the call (``track_mamba_state_if_needed_kernel``, named after Mamba)
    launches=("mamba",),
    # a prefill's last states, cast to the cache's dtype and scattered into the engine's state cache
    # (``ssm_state[indices] = last_state.to(...)``): the call's ``new_state`` written where the engine keeps it
    tail_words=("copy", "index_put"),
    natives=_natives,
    # decode-only steps run its packed decode kernel: the same recurrence on the packed projections
    engine_kernel=engine_kernels.engine_triton("flash-linear-attention kernels", engines=("vLLM", "SGLang")),
    input_values=input_values,
    rounds_through=_rounds_through,
    atol_of_largest=_chunked,
    atol_scaled_by=_output_read_from_state,
)
