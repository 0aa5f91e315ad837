"""The recorder's step learning and replay, driven through real hook wrappers."""

import json

import pytest
import torch

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.paged_layout import paged_batches
from fi_profile.capture.patching import wrap, wrap_boundary
from fi_profile.capture.recorder import RECORDER, Recorder
from fi_profile.families import attention as attention_family
from fi_profile.families import gemm
from fi_profile.schema.dtype import DType
from fi_profile.schema.run_info import RunInfo


def make_hooks():
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    ran = []

    def linear(x):
        ran.append(x.shape[0])
        return x

    hooked_linear = wrap(linear, "gemm", lambda x: [gemm.call(x, *weight.shape)])
    boundary = wrap_boundary(lambda sig: None, "step", lambda sig: RECORDER.begin_step(sig))
    return hooked_linear, boundary, ran


def step(hooked_linear, boundary, tokens, calls):
    boundary(("tokens", tokens))
    for _ in range(calls):
        hooked_linear(torch.zeros(tokens, 32, dtype=torch.bfloat16))


def test_replayed_steps_count_like_recorded_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    hooked_linear, boundary, ran = make_hooks()
    step(hooked_linear, boundary, 5, 3)  # learned
    step(hooked_linear, boundary, 1, 3)  # learned
    for _ in range(4):
        step(hooked_linear, boundary, 1, 3)  # replayed
    RECORDER.flush(tmp_path)
    assert RECORDER.step_stats == {"learned": 2, "replayed": 4}
    assert RECORDER.calls == {"gemm_bf16_n64_k32": 18} and len(ran) == 18
    assert RECORDER.workloads == {("gemm_bf16_n64_k32", (("M", 5),)): 3, ("gemm_bf16_n64_k32", (("M", 1),)): 15}
    assert not RECORDER.errors


def test_live_hooks_are_recorded_in_replayed_steps(tmp_path, monkeypatch):
    """A live hook (attention: its KV pages are not in the step signature) records its own axes in
    every step, in full capture; in count-only capture it is replayed like the rest."""
    weight = torch.zeros(16, 32, dtype=torch.bfloat16)
    hooked_linear, boundary, _ = make_hooks()
    live = wrap(lambda x: x, "attention", lambda x: [gemm.call(x, *weight.shape)], live=True)
    for count_only in (False, True):
        monkeypatch.setattr(RECORDER, "active", True)
        RECORDER.reset()
        RECORDER.count_only = count_only
        for k in (8, 9, 10, 11):  # one signature, a different M of the live call every step
            step(hooked_linear, boundary, 2, 2)
            live(torch.zeros(k, 32, dtype=torch.bfloat16))
        RECORDER.flush(tmp_path)
        assert RECORDER.step_stats == {"learned": 1, "replayed": 3} and not RECORDER.errors
        assert RECORDER.calls == {"gemm_bf16_n64_k32": 8, "gemm_bf16_n16_k32": 4}
        if not count_only:
            assert RECORDER.workloads == {("gemm_bf16_n64_k32", (("M", 2),)): 8,
                                          **{("gemm_bf16_n16_k32", (("M", k),)): 1 for k in (8, 9, 10, 11)}}
    RECORDER.count_only = False


def test_replay_mismatch_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    hooked_linear, boundary, _ = make_hooks()
    step(hooked_linear, boundary, 2, 3)
    step(hooked_linear, boundary, 2, 2)  # same signature, one call fewer
    RECORDER.flush(tmp_path)
    (message,) = RECORDER.errors
    assert message.startswith("step replay: 2 hooked calls where the learned step had 3")


def test_without_boundaries_every_call_is_recorded(tmp_path):
    recorder = Recorder()
    call = gemm.call(torch.zeros(4, 32), 8, 32)
    for _ in range(3):
        recorder.record([call], "gemm")
    assert recorder.calls == {"gemm_fp32_n8_k32": 3} and recorder.step_stats == {}


def attention_hooks(page_size: int = 4):
    """A hooked attention whose call carries index tensors (kv_indices of the step's layout)."""
    def attention(q_lens, seq_lens):
        return q_lens

    def to_calls(q_lens, seq_lens):
        qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
        table = torch.arange(64).reshape(8, 8)
        decode, prefill = paged_batches(qsl, torch.tensor(seq_lens), table[: len(q_lens)], page_size)
        batch, stage = (decode, "decode") if prefill is None else (prefill, "prefill")
        return [attention_family.call(batch, stage, 4, 2, 64, page_size, 64, DType.bfloat16, 0.125)]

    return wrap(attention, "attention", to_calls)


def test_autosave_keeps_whole_steps_readable_during_the_run(tmp_path, monkeypatch):
    """Saved at every boundary (interval 0): after each step the parts on disk merge into the
    record of the steps completed so far, tensors included, as if the process died there."""
    from fi_profile.capture.output import merge_parts

    monkeypatch.setattr(RECORDER, "active", True)
    monkeypatch.setattr(RECORDER, "autosave", (tmp_path, 0.0))
    monkeypatch.setattr(RECORDER, "page_size", 4)
    RECORDER.reset()
    hooked_linear, boundary, _ = make_hooks()
    attention = attention_hooks()
    layouts = [([5, 3], [5, 3]), ([1, 1], [6, 4]), ([1, 1], [7, 5]), ([1, 1], [8, 6])]
    for done, (q_lens, seq_lens) in enumerate(layouts):
        boundary(("layout", tuple(q_lens), tuple(seq_lens)))
        if done:  # the boundary saved the steps before this one
            summary = merge_parts(tmp_path, "m", "vLLM", 8)
            assert {k.id: k.count for k in summary.record.kernels}["gemm_bf16_n64_k32"] == 2 * done
            assert sum(summary.distinct_workloads.values()) >= 2
            blob_paths = {p for p in (tmp_path / "blob").rglob("*.safetensors")}
            assert blob_paths  # the attention workloads' kv_indptr / kv_indices were written
        hooked_linear(torch.zeros(sum(q_lens), 32, dtype=torch.bfloat16))
        attention(q_lens, seq_lens)
        hooked_linear(torch.zeros(sum(q_lens), 32, dtype=torch.bfloat16))
    monkeypatch.setattr(RECORDER, "autosave", None)
    RECORDER.flush(tmp_path)
    summary = merge_parts(tmp_path, "m", "vLLM", 8)
    assert {k.id: k.count for k in summary.record.kernels}["gemm_bf16_n64_k32"] == 2 * len(layouts)


def test_nvtx_ranges_are_named_after_the_definition_in_learned_and_replayed_steps(monkeypatch):
    import fi_profile.capture.patching as patching

    ranges = []
    monkeypatch.setattr(patching, "_push", ranges.append)
    monkeypatch.setattr(patching, "_pop", lambda: ranges.append("pop"))
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    hooked_linear, boundary, _ = make_hooks()
    step(hooked_linear, boundary, 2, 2)  # learned
    step(hooked_linear, boundary, 2, 2)  # replayed
    assert ranges == ["gemm_bf16_n64_k32", "pop"] * 4


def test_nvtx_only_when_a_tool_listens_unless_forced(monkeypatch):
    pytest.importorskip("nvtx")  # a dependency, but engines' bundles may lack it: the hooks do without
    from fi_profile.capture.patching import _nvtx_functions

    monkeypatch.delenv("FI_PROFILE_NVTX", raising=False)
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    assert _nvtx_functions() == (None, None)
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so")
    assert all(_nvtx_functions())
    monkeypatch.setenv("FI_PROFILE_NVTX", "0")
    assert _nvtx_functions() == (None, None)
    monkeypatch.delenv("NVTX_INJECTION64_PATH")
    monkeypatch.setenv("FI_PROFILE_NVTX", "1")
    assert all(_nvtx_functions())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_samples_are_copied_to_pinned_memory_and_land_in_the_blob(tmp_path, monkeypatch):
    """Samples of device tensors are copied to the host without a sync (pinned, non-blocking);
    the part's blob holds each exactly once the recorder synchronized."""
    from safetensors.torch import load_file

    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    expected = {}
    for n in (3, 5, 7, 0):
        indices = torch.arange(n, dtype=torch.int32, device="cuda") * 7 + n
        call = KernelCall(gemm.call(torch.zeros(n, 32), 8, 32).definition, {"M": n}, {"idx": indices})
        RECORDER.record([call], "gemm")
        expected[n] = indices.cpu()
    samples = [s.tensors["idx"] for s in RECORDER.samples.values()]
    assert all(t.is_pinned() for t in samples if t.numel())
    part = json.loads(RECORDER.flush(tmp_path).read_text())
    blob = load_file(tmp_path / part["blob"])
    for w in part["workloads"]:
        assert torch.equal(blob[w["tensors"]["idx"]], expected[w["axes"]["M"]])


@pytest.mark.parametrize("gap, said", [
    ({"hooks_missing": ["sglang.x.RadixAttention: none of ('forward',)"]}, "hook points not found (their calls are not in the record)"),
    ({"not_covered": {"Fp8LinearMethod": 32}}, "layers whose kernels no hook records"),
    ({"inexact": {"RMSNorm under vLLM's sequence parallelism": 161}}, "layers recorded at other shapes than their kernels ran"),
])
def test_what_the_hooks_could_not_see_makes_the_record_incomplete(tmp_path, monkeypatch, gap, said):
    """A hook point this engine version lacks, or layers no hook covers: the record says it is
    incomplete (and the command exits 1), never a record that only looks whole."""
    from fi_profile.capture.output import merge_parts

    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    hooked_linear, boundary, _ = make_hooks()
    step(hooked_linear, boundary, 2, 1)
    RECORDER.flush(tmp_path)
    run = RunInfo.model_validate({"hooks_missing": [], **gap})
    summary = merge_parts(tmp_path, "m", "vLLM", 8, run)
    assert said in summary.record.run.incomplete
    RECORDER.active = False
