"""Whether vLLM's Triton attention runs slower in an engine-like stream than replayed alone.

  python benchmarks/attention_conditions.py --json attention_conditions.json   # vLLM importable, a GPU

The accounting measured vLLM's ``kernel_unified_attention`` about 14% slower inside the engine than
replay times it alone (H100). This times the kernel, through replay's ``vllm_triton`` Solution, on
synthetic batches (decode of 64 and 20 sequences with 200-2300 tokens of context, a mixed step of 17
prefills of 960 tokens and 19 decodes, each part alone) under the conditions the engine differs in,
each as CUPTI's median kernel duration (µs, what ``run.engine_kernels`` sums):

- ``isolated_separate_kv``: as replay runs it: separate K and V caches, the L2 flushed (read) before each call;
- ``isolated_interleaved_kv``: on vLLM's cache layout, K and V interleaved per block;
- ``stream_N_caches_gemm_between``: N layers' caches (as many as fit), one call per layer, a GEMM
  between (the engine's other kernels evicting the L2, its TLB walking another layer's cache);
- ``stream_one_cache_gemm_between``: the same on one cache;
- ``stream_N_caches_flush_between``: the layers' caches with only the flush between.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable, Optional

import torch
from torch.profiler import ProfilerActivity, profile

from fi_profile.families.attention.vllm_triton_attention import run as vllm_triton_attention

PAGES, PAGE, KV_HEADS, HEAD_DIM, HEADS = 25756, 16, 8, 128, 32
KERNEL = "kernel_unified_attention"


def kernel_us(fn: Callable[[], None], repeats: int) -> tuple[Optional[float], int]:
    """The median CUPTI duration of the attention kernels ``fn`` launched over ``repeats`` calls."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time for e in prof.events() if e.name == KERNEL]
    return (statistics.median(times) if times else None), len(times)


def layout(contexts: list[int], q_lens: Optional[list[int]], generator: torch.Generator):
    """kv_indptr, kv_indices (distinct random pages), kv_last_page_len, qo_indptr (None: decode)."""
    pages = [(c + PAGE - 1) // PAGE for c in contexts]
    indices = torch.randperm(PAGES, generator=generator)[: sum(pages)].to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor([c - (p - 1) * PAGE for c, p in zip(contexts, pages)], dtype=torch.int32)
    qo = None if q_lens is None else torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return [None if t is None else t.cuda() for t in (indptr, indices, last, qo)]


def case(contexts: list[int], q_lens: Optional[list[int]], layers: int, generator: torch.Generator) -> dict:
    indptr, indices, last, qo = layout(contexts, q_lens, generator)
    tokens = sum(q_lens) if q_lens else len(contexts)
    q = torch.randn(tokens, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    weight = torch.randn(2 * 14336, 4096, device="cuda", dtype=torch.bfloat16)  # Llama-3.1-8B's gate/up
    x = torch.randn(min(tokens, 4096), 4096, device="cuda", dtype=torch.bfloat16)
    caches = [torch.randn(PAGES, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    k, v = (torch.randn(PAGES, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def attend(k_cache, v_cache):
        vllm_triton_attention(q, k_cache, v_cache, indptr, indices, HEAD_DIM ** -0.5, qo_indptr=qo, kv_last_page_len=last)

    attend(k, v)
    torch.cuda.synchronize()
    passes = 1 if tokens > 4096 else 2
    found = {
        "isolated_separate_kv": kernel_us(lambda: (flush.sum(), attend(k, v)), 20),
        "isolated_interleaved_kv": kernel_us(lambda: (flush.sum(), attend(caches[0][:, 0], caches[0][:, 1])), 20),
        f"stream_{layers}_caches_gemm_between": kernel_us(
            lambda: [(x @ weight.T, attend(c[:, 0], c[:, 1])) for c in caches], passes),
        "stream_one_cache_gemm_between": kernel_us(
            lambda: [(x @ weight.T, attend(caches[0][:, 0], caches[0][:, 1])) for _ in caches], passes),
        f"stream_{layers}_caches_flush_between": kernel_us(
            lambda: [(flush.sum(), attend(c[:, 0], c[:, 1])) for c in caches], passes),
    }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--layers", type=int, default=28, help="decode: layers' caches in the stream (1.7 GB each)")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)

    def contexts(n: int) -> list[int]:
        return [int(c) for c in torch.randint(200, 2300, (n,), generator=generator)]

    prefill_q = [960] * 17
    prefill_context = [960 + (200 if i % 3 == 0 else 0) for i in range(17)]
    decode_19 = contexts(19)
    cases = {
        "decode_b64": (contexts(64), None, args.layers),
        "decode_b20": (contexts(20), None, args.layers),
        "prefill_17": (prefill_context, prefill_q, 8),
        "mixed_17_prefills_19_decodes": (prefill_context + decode_19, prefill_q + [1] * 19, 8),
        "decode_19_alone": (decode_19, None, 8),
    }
    results = {"device": torch.cuda.get_device_name()}
    for name, (ctx, q_lens, layers) in cases.items():
        results[name] = case(ctx, q_lens, layers, generator)
        torch.cuda.empty_cache()  # the case's caches, gone with it
        print(name, json.dumps(results[name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
