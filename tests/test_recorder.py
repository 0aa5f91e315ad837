"""The recorder's step learning and replay, driven through real hook wrappers."""

import torch

from hooks.patching import wrap, wrap_boundary
from profiler.capture import ops
from profiler.capture.recorder import RECORDER, Recorder


def make_hooks():
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    ran = []

    def linear(x):
        ran.append(x.shape[0])
        return x

    hooked_linear = wrap(linear, "gemm", lambda x: [ops.gemm(x, weight)])
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
    assert RECORDER.calls == {"gemm_n64_k32": 18} and len(ran) == 18
    assert RECORDER.workloads == {("gemm_n64_k32", (("M", 5),)): 3, ("gemm_n64_k32", (("M", 1),)): 15}
    assert not RECORDER.errors


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
    call = ops.gemm(torch.zeros(4, 32), torch.zeros(8, 32))
    for _ in range(3):
        recorder.record([call], "gemm")
    assert recorder.calls == {"gemm_n8_k32_float32": 3} and recorder.step_stats == {}


def attention_hooks(page_size: int = 4):
    """A hooked attention whose call carries index tensors (kv_indices of the step's layout)."""
    def attention(q_lens, seq_lens):
        return q_lens

    def to_calls(q_lens, seq_lens):
        qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
        table = torch.arange(64).reshape(8, 8)
        decode, prefill = ops.paged_batches(qsl, torch.tensor(seq_lens), table[: len(q_lens)], page_size)
        batch, stage = (decode, "decode") if prefill is None else (prefill, "prefill")
        return [ops.paged_attention(batch, stage, 4, 2, 64, page_size, 64, ops.DType.bfloat16, 0.125)]

    return wrap(attention, "attention", to_calls)


def test_autosave_keeps_whole_steps_readable_during_the_run(tmp_path, monkeypatch):
    """Saved at every boundary (interval 0): after each step the parts on disk merge into the
    record of the steps completed so far, tensors included, as if the process died there."""
    from profiler.capture.output import merge_parts

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
            assert {k.id: k.count for k in summary.record.kernels}["gemm_n64_k32"] == 2 * done
            assert sum(summary.distinct_workloads.values()) >= 2
            blob_paths = {p for p in (tmp_path / "blob").rglob("*.safetensors")}
            assert blob_paths  # the attention workloads' kv_indptr / kv_indices were written
        hooked_linear(torch.zeros(sum(q_lens), 32, dtype=torch.bfloat16))
        attention(q_lens, seq_lens)
        hooked_linear(torch.zeros(sum(q_lens), 32, dtype=torch.bfloat16))
    monkeypatch.setattr(RECORDER, "autosave", None)
    RECORDER.flush(tmp_path)
    summary = merge_parts(tmp_path, "m", "vLLM", 8)
    assert {k.id: k.count for k in summary.record.kernels}["gemm_n64_k32"] == 2 * len(layouts)


def test_nvtx_ranges_are_named_after_the_definition_in_learned_and_replayed_steps(monkeypatch):
    import hooks.patching as patching

    ranges = []
    monkeypatch.setattr(patching, "_push", ranges.append)
    monkeypatch.setattr(patching, "_pop", lambda: ranges.append("pop"))
    monkeypatch.setattr(RECORDER, "active", True)
    RECORDER.reset()
    hooked_linear, boundary, _ = make_hooks()
    step(hooked_linear, boundary, 2, 2)  # learned
    step(hooked_linear, boundary, 2, 2)  # replayed
    assert ranges == ["gemm_n64_k32", "pop"] * 4


def test_nvtx_only_when_a_tool_listens_unless_forced(monkeypatch):
    from hooks.patching import _nvtx_functions

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
