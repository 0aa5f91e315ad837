"""The collectives of a tensor-parallel group (all-reduce, SGLang's all-reduce fused with the next
RMSNorm, the logits' all-gather): their Definitions made for the group's size and the tensor's
width, references that compute what every rank holds afterwards, the engines' hooks, and a replay
that leaves them out, saying why."""

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from fi_profile.capture.kernel_accounting import _Fits
from fi_profile.cli import app
from fi_profile.entry_points import run_reference
from fi_profile.families import KERNEL_WORDS, collective
from fi_profile.replay.dataset import load_dataset
from fi_profile.replay.runner import ReplayOptions, not_replayed, replay


def test_definitions_are_named_by_the_groups_size_and_the_tensors_width():
    x = torch.zeros(3, 5, 96, dtype=torch.bfloat16)  # a 3-D activation: 15 rows of 96
    reduce = collective.all_reduce_call(x, 4)
    assert reduce.definition.name == "all_reduce_r4_h96" and reduce.axes == {"num_tokens": 15}
    assert reduce.definition.const_axes == {"num_ranks": 4, "hidden_size": 96}
    fused = collective.fused_add_rmsnorm_call(x[0], x[0], 1e-6, 8)
    assert fused.definition.name == "all_reduce_fused_add_rmsnorm_r8_h96" and "EPS = 1e-06" in fused.definition.reference
    gathered = collective.all_gather_call(torch.zeros(2, 100, dtype=torch.float32), 2)
    assert gathered.definition.name == "all_gather_r2_n100_float32"
    assert gathered.definition.const_axes == {"num_ranks": 2, "shard_size": 100, "gathered_size": 200}
    assert collective.all_reduce_call(x, 1) is None and collective.all_gather_call(x, 1) is None  # a group of one
    with pytest.raises(NotImplementedError, match="dimension 0"):
        collective.all_gather_call(x, 2, dim=0)


def test_references_give_what_every_rank_holds_afterwards():
    torch.manual_seed(0)
    shares = torch.randn(4, 6, 32, dtype=torch.bfloat16)
    reduce = collective.all_reduce_call(shares[0], 4).definition
    (out,) = run_reference(reduce, {"rank_inputs": shares}).values()
    torch.testing.assert_close(out, shares.double().sum(0).to(torch.bfloat16), atol=0.02, rtol=0.01)

    residual, weight = torch.randn(6, 32, dtype=torch.bfloat16), torch.rand(32, dtype=torch.bfloat16)
    fused = collective.fused_add_rmsnorm_call(shares[0], residual, 1e-6, 4).definition
    outputs = run_reference(fused, {"rank_inputs": shares, "residual": residual, "weight": weight})
    summed = shares.double().sum(0) + residual.double()
    normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    torch.testing.assert_close(outputs["residual_out"], summed.to(torch.bfloat16), atol=0.02, rtol=0.01)
    torch.testing.assert_close(outputs["output"], normed.to(torch.bfloat16), atol=0.02, rtol=0.01)

    shards = torch.randn(2, 3, 5)
    gather = collective.all_gather_call(shards[0], 2).definition
    (out,) = run_reference(gather, {"rank_inputs": shards}).values()
    assert torch.equal(out, torch.cat([shards[0], shards[1]], dim=-1))  # rank 0's shard first


def test_group_hooks_read_the_groups_size_and_skip_a_group_of_one():
    x = torch.zeros(7, 64, dtype=torch.bfloat16)
    (call,) = collective.group_all_reduce_calls(SimpleNamespace(world_size=2), x)
    assert call.definition.name == "all_reduce_r2_h64" and call.axes == {"num_tokens": 7}
    assert collective.group_all_reduce_calls(SimpleNamespace(world_size=1), x) == [None]
    (gather,) = collective.group_all_gather_calls(SimpleNamespace(world_size=2), x, dim=1)
    assert gather.definition.name == "all_gather_r2_n64"


def test_sglangs_fused_all_reduce_records_one_call_and_marks_the_norm_seen(monkeypatch):
    from fi_profile.capture.layers import SEEN_WEIGHTS
    from fi_profile.hooks.sglang import hook_points

    monkeypatch.setattr(hook_points, "_group_size", lambda use_attn_tp_group=True: 2 if use_attn_tp_group else 4)
    x, residual, weight = torch.zeros(5, 64, dtype=torch.bfloat16), torch.zeros(5, 64, dtype=torch.bfloat16), torch.ones(64)
    (call,) = hook_points._all_reduce_fused_add_rmsnorm(x, residual, weight, eps=1e-6)
    assert call.definition.name == "all_reduce_fused_add_rmsnorm_r2_h64" and id(weight) in SEEN_WEIGHTS
    (moe,) = hook_points._all_reduce_fused_add_rmsnorm(x, residual, weight, eps=1e-6, use_attn_tp_group=False)
    assert moe.definition.name == "all_reduce_fused_add_rmsnorm_r4_h64"
    # a tensor the kernel declines: SGLang runs the norm layer instead, whose own hook records it
    assert hook_points._all_reduce_fused_add_rmsnorm(torch.zeros(64, 5).t(), residual, weight) == []


@pytest.mark.parametrize("kernel, op_type", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, ...)", "all_reduce"),
    ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<...>", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
])
def test_the_engines_collective_kernels_are_named_as_the_family_says(kernel, op_type):
    """Each fits the collective's op type best (FlashInfer's fused one is also a ``flashinfer`` kernel)."""
    fits = _Fits(KERNEL_WORDS, {}, {}, {}, frozenset())
    assert fits.best(kernel) == {op_type}


def test_the_replay_leaves_collectives_out_and_says_why(tmp_path):
    definition = collective.all_reduce_call(torch.zeros(1, 16, dtype=torch.bfloat16), 2).definition
    for kind in ("definitions", "workloads"):
        (tmp_path / kind / "all_reduce").mkdir(parents=True)
    (tmp_path / "definitions" / "all_reduce" / f"{definition.name}.json").write_text(definition.to_json())
    workload = {"definition": definition.name, "workload": {"uuid": "w0", "axes": {"num_tokens": 4},
                                                            "inputs": {"rank_inputs": {"type": "random"}}}}
    (tmp_path / "workloads" / "all_reduce" / f"{definition.name}.jsonl").write_text(json.dumps(workload) + "\n")
    dataset = load_dataset(tmp_path)
    assert "one GPU cannot replay" in not_replayed(dataset.definitions.values())[definition.name]
    assert replay(dataset, [], True, tmp_path / "out", ReplayOptions(device="cpu", min_time_s=0.01)) == []
    result = CliRunner().invoke(app, ["replay", str(tmp_path), "--out", str(tmp_path / "cli"), "--device", "cpu"])
    said = " ".join(result.output.split())
    assert f"not replayed: {definition.name} (a collective among GPUs" in said
    # nothing else to replay: nothing ran, and the exit says so (it was 0, with an empty breakdown)
    assert result.exit_code == 1 and "nothing was replayed of 1 Definition(s)" in said, result.output


def test_a_definition_without_workloads_is_named_and_the_rest_replays(tmp_path):
    """flashinfer-trace has Definitions without workloads (``gdn_decode_qk4_v8_d128_k_last``): a
    replay of one printed "0 pairs" and exited 0. Each Definition left without pairs is named with
    why, beside those that ran."""
    from fi_profile.families import rmsnorm

    empty = rmsnorm.call(torch.zeros(2, 32, dtype=torch.bfloat16), None, 1e-6).definition
    ran = rmsnorm.call(torch.zeros(2, 64, dtype=torch.bfloat16), None, 1e-6).definition
    (tmp_path / "definitions" / "rmsnorm").mkdir(parents=True)
    (tmp_path / "workloads" / "rmsnorm").mkdir(parents=True)
    for definition in (empty, ran):
        (tmp_path / "definitions" / "rmsnorm" / f"{definition.name}.json").write_text(definition.to_json())
    workload = {"definition": ran.name, "workload": {"uuid": "w0", "axes": {"batch_size": 4},
                                                     "inputs": {"hidden_states": {"type": "random"},
                                                                "weight": {"type": "random"}}}}
    (tmp_path / "workloads" / "rmsnorm" / f"{ran.name}.jsonl").write_text(json.dumps(workload) + "\n")
    result = CliRunner().invoke(app, ["replay", str(tmp_path), "--out", str(tmp_path / "cli"), "--device", "cpu",
                                      "--min-time", "0.01"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert f"not replayed: {empty.name} ({tmp_path / 'workloads'} has no workload of it)" in said
    assert f"not replayed: {ran.name}" not in said
