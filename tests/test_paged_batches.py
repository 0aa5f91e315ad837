"""The step layout attention is recorded with: decode and prefill parts, page ids gathered from
the block table (on the CPU, and on a GPU without a synchronizing call)."""

import pytest
import torch

from fi_profile.capture import paged_layout


def layout(device: str):
    # four requests: two decodes (1 query token), two prefills (5 and 3), page size 4
    query_start_loc = torch.tensor([0, 1, 6, 7, 10])
    seq_lens = torch.tensor([9, 5, 4, 3])
    block_table = (torch.arange(4 * 6, dtype=torch.int32) + 100).reshape(4, 6).to(device)
    return query_start_loc, seq_lens, block_table


def check(decode, prefill):
    assert decode.qo_indptr.tolist() == [0, 1, 2] and decode.kv_indptr.tolist() == [0, 3, 4]
    assert decode.kv_indices.cpu().tolist() == [100, 101, 102, 112] and decode.kv_last_page_len.tolist() == [1, 4]
    assert prefill.qo_indptr.tolist() == [0, 5, 8] and prefill.kv_indptr.tolist() == [0, 2, 3]
    assert prefill.kv_indices.cpu().tolist() == [106, 107, 118] and prefill.kv_last_page_len.tolist() == [1, 3]
    assert decode.kv_indices.dtype == prefill.kv_indices.dtype == torch.int32
    assert paged_layout.step_shape(layout("cpu")[0], 4) == (10, 4, 2, 2)


def test_cpu_block_table():
    check(*paged_layout.paged_batches(*layout("cpu"), 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_block_table_gathers_there_without_a_sync():
    query_start_loc, seq_lens, block_table = layout("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode, prefill = paged_layout.paged_batches(query_start_loc, seq_lens, block_table, 4)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert decode.kv_indices.device.type == "cuda"
    check(decode, prefill)


def test_padding_requests_of_a_cuda_graph_batch_do_no_attention_work():
    """A CUDA graph padded to 4 requests for 3 decoding ones: the padding request has no query
    token (and no KV); it is in neither part and not counted as a request of the step."""
    query_start_loc = torch.tensor([0, 1, 2, 3, 3])
    seq_lens = torch.tensor([5, 9, 2, 0])
    block_table = torch.arange(40).reshape(4, 10)
    decode, prefill = paged_layout.paged_batches(query_start_loc, seq_lens, block_table, 4)
    assert prefill is None and decode.batch_size == 3 and decode.kv_indptr.tolist() == [0, 2, 5, 6]
    assert decode.kv_indices.tolist() == [0, 1, 10, 11, 12, 20]
    assert paged_layout.step_shape(query_start_loc, len(seq_lens)) == (3, 3, 3, 0)
