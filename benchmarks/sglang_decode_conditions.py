"""Whether SGLang's Triton decode attention runs slower in an engine-like stream than replayed alone.

  python benchmarks/sglang_decode_conditions.py --json sglang_decode_conditions.json   # SGLang importable, a GPU

The accounting measured SGLang's decode attention (``_fwd_grouped_kernel_stage1`` + ``_fwd_kernel_stage2``,
inside its CUDA graphs) about 12% slower than replay times it alone, at the same SM clock (H100,
Llama-3.1-8B; BENCHMARKS.md). This times the two kernels on a decode batch laid out as SGLang lays
it out (64 sequences with 32-2048 prompt tokens, each prompt's slots in one run of SGLang's token
pool, the decoded tokens' slots interleaved across the batch), under each condition the engine
differs in, as CUPTI's median summed duration of the two kernels per call (µs, what
``run.engine_kernels`` sums), with the SM clock sampled through NVML:

- ``replay``: as replay runs it (``sglang_triton`` Solution): the pages renumbered to the ones the
  batch uses, a contiguous q, the L2 flushed (read) before each call (int32 indices before the
  Solution took SGLang's int64, with this script's first run: ``replay_int32_indices``);
- ``engine_arguments``: the kernel called as SGLang's backend calls it: the whole token pool, int64
  indices, q a view into the QKV projection's output, the graph's shared split buffers; flushed before each call;
- ``engine_arguments_int32_indices``, ``engine_arguments_contiguous_q``: one of those changed back;
- ``eager_N_layers_gemm_between``: N layers' pools, one call per layer, a decode-sized gate/up GEMM between;
- ``graph_N_layers_gemm_between``: the same, captured as one CUDA graph and replayed (SGLang's decode);
- ``graph_N_layers``: the graph without the GEMMs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable

import torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from torch.profiler import ProfilerActivity, profile

from fi_profile.capture.gpu_clock import ClockSampler, nvml_reader
from fi_profile.families.attention.sglang_triton_attention import MAX_KV_SPLITS, _decode_layout
from fi_profile.families.attention.sglang_triton_attention import run as sglang_triton_attention

KV_HEADS, HEAD_DIM, HEADS = 8, 128, 32
STAGES = ("_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2")


def kernel_us(fn: Callable[[], None], repeats: int) -> dict:
    """The median summed CUPTI duration of the two decode kernels per call over ``repeats`` runs of
    ``fn``, how many calls, and the SM clock meanwhile."""
    read = nvml_reader()
    sampler = ClockSampler(read).start() if read is not None else None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    clock = sampler.stop() if sampler is not None else None
    events = sorted((e for e in prof.events() if e.name in STAGES), key=lambda e: e.time_range.start)
    calls, current = [], None
    for e in events:
        if e.name == STAGES[0]:
            current = e.device_time
        elif current is not None:
            calls.append(current + e.device_time)
            current = None
    return {"us": round(statistics.median(calls), 2) if calls else None, "calls": len(calls),
            "sm_clock_mhz": round(clock.mean_mhz(), 0) if clock is not None else None}


def sglang_layout(prompts: list[int], decoded: int, device: str):
    """SGLang's slots for a batch after ``decoded`` decode steps: each prompt's slots one run of the
    pool (allocated in order from slot 1), then each step's new tokens one slot per sequence."""
    per_sequence, next_slot = [], 1
    for p in prompts:
        per_sequence.append(list(range(next_slot, next_slot + p)))
        next_slot += p
    for _ in range(decoded):
        for slots in per_sequence:
            slots.append(next_slot)
            next_slot += 1
    lengths = [len(s) for s in per_sequence]
    indptr = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    indices = torch.tensor([i for s in per_sequence for i in s], dtype=torch.int64, device=device)
    return indptr, indices, next_slot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--layers", type=int, default=32, help="layers' token pools in the stream")
    parser.add_argument("--pool", type=int, default=423_510, help="tokens in each layer's pool (SGLang's, H100, 0.85)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--decoded", type=int, default=8, help="decode steps already taken")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    prompts = [int(p) for p in torch.randint(32, 2049, (args.batch,), generator=generator)]
    device = "cuda"
    indptr, indices, used = sglang_layout(prompts, args.decoded, device)
    bs, scale = args.batch, HEAD_DIM ** -0.5
    qkv = torch.randn(bs, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=device, dtype=torch.bfloat16)
    q_view = qkv[:, : HEADS * HEAD_DIM].view(bs, HEADS, HEAD_DIM)  # SGLang's q: a view into the QKV output
    q = q_view.contiguous()
    out = torch.empty_like(q)
    pools = [(torch.randn(args.pool + 1, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16),
              torch.randn(args.pool + 1, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16))
             for _ in range(args.layers)]
    # replay's form: the slots the batch uses renumbered 0..n-1 (workload_inputs.compact_pages), int32
    ranks = torch.unique(indices, sorted=True, return_inverse=True)[1].to(torch.int32)
    compact_k, compact_v = (p[torch.unique(indices)].unsqueeze(1).contiguous() for p in pools[0])
    splits = _decode_layout(q, indptr, indices, KV_HEADS)["num_kv_splits"]  # computed as SGLang's backend does
    max_bs = 160  # SGLang's graph buffers are sized for its largest graph batch
    logits = torch.empty(max_bs, HEADS, MAX_KV_SPLITS, HEAD_DIM, dtype=torch.float32, device=device)
    lse = torch.empty(max_bs, HEADS, MAX_KV_SPLITS, dtype=torch.float32, device=device)
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device=device)
    weight = torch.randn(2 * 14336, 4096, device=device, dtype=torch.bfloat16)  # Llama-3.1-8B's gate/up
    x = torch.randn(bs, 4096, device=device, dtype=torch.bfloat16)

    def engine(k, v) -> None:
        decode_attention_fwd(q_view, k, v, out.view(bs, HEADS, HEAD_DIM), indptr, indices, logits, lse, splits,
                             MAX_KV_SPLITS, scale, 1.0, 1.0, logit_cap=0.0, use_pdl=True, page_size=1)

    def engine_with(indices_, q_) -> Callable[[], None]:
        return lambda: (flush.sum(), decode_attention_fwd(
            q_, *pools[0], out.view(bs, HEADS, HEAD_DIM), indptr, indices_, logits, lse, splits, MAX_KV_SPLITS,
            scale, 1.0, 1.0, logit_cap=0.0, use_pdl=True, page_size=1))

    def replay() -> None:
        sglang_triton_attention(q, compact_k, compact_v, indptr, ranks, scale)

    def replay_int32_indices() -> None:
        decode_attention_fwd(q, compact_k.flatten(0, 1), compact_v.flatten(0, 1), out, indptr, ranks, logits, lse, splits,
                             MAX_KV_SPLITS, scale, 1.0, 1.0, logit_cap=0.0, use_pdl=True, page_size=1)

    def layers(gemm: bool) -> None:
        for k, v in pools:
            if gemm:
                torch.matmul(x, weight.T)
            engine(k, v)

    def graph_of(gemm: bool) -> torch.cuda.CUDAGraph:
        layers(gemm)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layers(gemm)
        return graph

    replay()
    engine(*pools[0])
    torch.cuda.synchronize()
    with_gemm, without = graph_of(True), graph_of(False)
    n = args.layers
    results = {"device": torch.cuda.get_device_name(), "batch": bs, "tokens": int(indices.numel()), "pool_used": used,
               "replay": kernel_us(lambda: (flush.sum(), replay()), 50),
               "replay_int32_indices": kernel_us(lambda: (flush.sum(), replay_int32_indices()), 50),
               "engine_arguments": kernel_us(lambda: (flush.sum(), engine(*pools[0])), 50),
               "engine_arguments_int32_indices": kernel_us(engine_with(indices.to(torch.int32), q_view), 50),
               "engine_arguments_contiguous_q": kernel_us(engine_with(indices, q), 50),
               f"eager_{n}_layers_gemm_between": kernel_us(lambda: layers(True), 3),
               f"graph_{n}_layers_gemm_between": kernel_us(with_gemm.replay, 3),
               f"graph_{n}_layers": kernel_us(without.replay, 3)}
    print(json.dumps(results, indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
