"""How the shape of a torch.compile'd op's first call sets its kernels' speed on every shape.

  python benchmarks/inductor_first_call.py --json inductor_first_call.json   # a GPU with Triton

Inductor sizes a kernel's block candidates from the first call's shapes and autotunes among them
on that call; the winner then serves every shape. SwiGLU (Llama-3.1-8B's, 14336 wide) is timed
(CUPTI median, µs, the L2 flushed before each call) on 16384, 4717 and 64 tokens:

- as Inductor's generated kernel source (the one vLLM's graph mode runs) launched with each
  ``(XBLOCK, num_warps)`` Inductor's pointwise heuristics offer for large shapes, and a few more;
- torch.compile'd as replay builds it (no FX graph cache: Inductor's cache ignores a dynamic
  dimension's size hint, and would serve the first variant's graph to the second), first called on
  2 tokens, then on the timed shape (var axis dynamic);
- the same, first called on 16384 tokens (what replay does: its Definition's largest workload first).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

INTER = 14336
SHAPES = (16384, 4717, 64)
CONFIGS = ((1024, 4), (512, 8), (2048, 8), (1024, 8), (4096, 16))


@triton.jit
def silu_mul(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    """Inductor's ``triton_poi_fused_mul_silu_slice`` as vLLM 0.26 generated it (torch 2.11)."""
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex % 14336
    x1 = xindex // 14336
    gate = tl.load(in_ptr0 + (x0 + 28672 * x1), xmask).to(tl.float32)
    up = tl.load(in_ptr0 + (14336 + x0 + 28672 * x1), xmask).to(tl.float32)
    tl.store(out_ptr0 + xindex, gate / (tl.exp(-gate) + 1.0) * up, xmask)


def swiglu(input):
    gate, up = input.chunk(2, dim=-1)
    return F.silu(gate) * up


def kernel_us(fn: Callable[[], None], flush: torch.Tensor, repeats: int = 20) -> Optional[float]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            flush.sum()
            fn()
        torch.cuda.synchronize()
    times = [e.device_time for e in prof.events() if "silu" in e.name]
    return statistics.median(times) if times else None


def compiled_first_on(tokens: int) -> Callable[[torch.Tensor], torch.Tensor]:
    torch._dynamo.reset()
    compiled = torch.compile(swiglu, options={"fx_graph_cache": False})  # as replay builds it: no graph cached for other shapes
    first = torch.randn(tokens, 2 * INTER, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.maybe_mark_dynamic(first, 0)
    compiled(first)
    return compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    inputs = {n: torch.randn(n, 2 * INTER, device="cuda", dtype=torch.bfloat16) for n in SHAPES}
    results: dict = {"device": torch.cuda.get_device_name()}
    for n, x in inputs.items():
        out = torch.empty(n, INTER, device="cuda", dtype=torch.bfloat16)
        for block, warps in CONFIGS:
            launch = functools.partial(silu_mul[(triton.cdiv(n * INTER, block),)], x, out, n * INTER,
                                       XBLOCK=block, num_warps=warps)
            results[f"{n}_xblock{block}_warps{warps}"] = kernel_us(launch, flush)
    for first in (2, max(SHAPES)):
        compiled = compiled_first_on(first)
        for n, x in inputs.items():
            torch._dynamo.maybe_mark_dynamic(x, 0)
            compiled(x)
            results[f"{n}_compiled_first_on_{first}"] = kernel_us(functools.partial(compiled, x), flush)
    for key, value in results.items():
        print(key, value)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
