"""How replay's timing of one kernel compares with the same kernel inside an engine-like stream.

  python benchmarks/l2_state.py --json l2_state.json [--layers 16] [--tokens 16 64 512 2048]

The stream: Llama-3.1-8B-shaped decoder layers without attention (fused add-RMSNorm, QKV GEMM,
RoPE on q and k, O GEMM, fused add-RMSNorm, gate/up GEMM, SiLU-and-mul, down GEMM), every layer
with its own weights, the elementwise ops compiled by Inductor as vLLM's graph mode compiles them,
the whole stream captured as one CUDA graph and replayed under torch.profiler: each kernel's
duration as CUPTI reports it, which is what ``run.engine_kernels`` sums. Then each op alone, on the
same shapes, timed by replay's ``fi_profile.replay.timing.measure`` (the L2 flushed before each
call by reading a buffer twice its size):

- ``events_cold``: CUDA events around the call, every input cold;
- ``events_warm_inputs``: the same, the op's per-step inputs (what the previous kernel of the
  stream wrote: activations, not weights) read back into the L2 after the flush, as they sit
  there in the stream;
- ``kernels_cold`` / ``kernels_warm_inputs``: the op's own kernels' durations from CUPTI
  (torch.profiler) instead of events.

Each row: the op, the token count, its mean time in the stream and each method's ratio to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from typing import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from fi_profile.replay.timing import measure

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 4096, 32, 8, 128, 14336
EPS = 1e-5


def add_rms_norm(x, residual, weight):
    residual = x.float() + residual.float()
    normed = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + EPS)
    return (normed * weight.float()).to(x.dtype), residual.to(x.dtype)


def rope(positions, q, k, cos_sin):
    cos, sin = cos_sin[positions].float().chunk(2, dim=-1)

    def rotate(t, heads):
        t = t.view(t.shape[0], heads, HEAD_DIM).float()
        x1, x2 = t[..., : HEAD_DIM // 2], t[..., HEAD_DIM // 2:]
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(q.dtype).flatten(1)

    return rotate(q, HEADS), rotate(k, KV_HEADS)


def silu_and_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Stream:
    """The layers' weights and the ops, as ``(name, fn, per-step input names, weight names)``."""

    def __init__(self, layers: int, device: torch.device) -> None:
        def w(*shape):
            return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

        self.layers = [
            {"wqkv": w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "wo": w(HIDDEN, HIDDEN),
             "wgu": w(2 * INTER, HIDDEN), "wd": w(HIDDEN, INTER),
             "n1": torch.ones(HIDDEN, device=device, dtype=torch.bfloat16),
             "n2": torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)}
            for _ in range(layers)
        ]
        self.cos_sin = torch.randn(8192, HEAD_DIM, device=device, dtype=torch.bfloat16)
        self.norm = torch.compile(add_rms_norm, dynamic=False)
        self.rope = torch.compile(rope, dynamic=False)
        self.act = torch.compile(silu_and_mul, dynamic=False)

    def forward(self, x, residual, positions, mark: Callable[[str], object] = lambda name: contextlib.nullcontext()):
        for layer in self.layers:
            with mark("norm"):
                h, residual = self.norm(x, residual, layer["n1"])
            with mark("gemm_qkv"):
                qkv = F.linear(h, layer["wqkv"])
            q, k = qkv[:, :HIDDEN], qkv[:, HIDDEN:HIDDEN + KV_HEADS * HEAD_DIM]
            with mark("rope"):
                q, k = self.rope(positions, q, k, self.cos_sin)
            with mark("gemm_o"):
                o = F.linear(q, layer["wo"])
            with mark("norm"):
                h, residual = self.norm(o, residual, layer["n2"])
            with mark("gemm_gate_up"):
                gu = F.linear(h, layer["wgu"])
            with mark("silu_and_mul"):
                a = self.act(gu)
            with mark("gemm_down"):
                x = F.linear(a, layer["wd"])
        return x, residual


MARKS_PER_LAYER = {"norm": 2, "gemm_qkv": 1, "rope": 1, "gemm_o": 1, "gemm_gate_up": 1, "silu_and_mul": 1, "gemm_down": 1}
#: the GEMM that follows each elementwise op in a layer
GEMM_AFTER = {"norm_1": "gemm_qkv", "rope": "gemm_o", "norm_2": "gemm_gate_up", "silu_and_mul": "gemm_down"}


def stream_times(stream: Stream, tokens: int, device: torch.device) -> dict[str, float]:
    """op -> mean µs per call of its kernels inside the CUDA-graph stream."""
    x = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    positions = torch.randint(0, 8192, (tokens,), device=device)
    for _ in range(3):
        stream.forward(x, residual, positions)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        stream.forward(x, residual, positions)
    torch.cuda.current_stream(device).wait_stream(side)
    with torch.cuda.graph(graph):
        stream.forward(x, residual, positions)
    graph.replay()
    torch.cuda.synchronize(device)
    replays = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize(device)
    kernels = sorted((e for e in prof.events() if _is_kernel(e)), key=lambda e: e.time_range.start)
    sums: dict[str, float] = {}
    for op, event in zip(_labels(kernels), kernels):
        sums[op] = sums.get(op, 0.0) + event.time_range.elapsed_us()
    calls = replays * len(stream.layers)
    return {op: total / (calls * MARKS_PER_LAYER[op]) for op, total in sums.items()}


def _is_kernel(event) -> bool:
    name = event.name.lower()
    return event.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in name and "memset" not in name


def _labels(kernels) -> list[str]:
    """Each kernel's op: Inductor's kernels by their names (a norm's reduction holds ``rsqrt``,
    SwiGLU's ``silu``, the rest is RoPE); a GEMM's kernels by the elementwise op before them."""
    labels, last, norms = [], None, 0
    for kernel in kernels:
        name = kernel.name
        if name.startswith("triton_"):
            op = "silu_and_mul" if "silu" in name else "norm" if "rsqrt" in name or "mean" in name else "rope"
            if op == "norm" and last not in ("norm_1", "norm_2"):
                norms += 1
                last = f"norm_{2 - norms % 2}"
            elif op != "norm":
                last = op
            labels.append(op)
        else:
            if last is None:
                raise SystemExit(f"a GEMM kernel ({name}) before any elementwise kernel")
            labels.append(GEMM_AFTER[last])
    return labels


def isolated_ops(stream: Stream, tokens: int, device: torch.device):
    """(op, call, per-step inputs) on the first layer's weights at ``tokens``."""
    layer = stream.layers[0]
    x = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    positions = torch.randint(0, 8192, (tokens,), device=device)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=device, dtype=torch.bfloat16)
    q, k = qkv[:, :HIDDEN], qkv[:, HIDDEN:HIDDEN + KV_HEADS * HEAD_DIM]
    a = torch.randn(tokens, INTER, device=device, dtype=torch.bfloat16)
    gu = torch.randn(tokens, 2 * INTER, device=device, dtype=torch.bfloat16)
    return [
        ("norm", lambda: stream.norm(x, residual, layer["n1"]), [x, residual]),
        ("gemm_qkv", lambda: F.linear(x, layer["wqkv"]), [x]),
        ("rope", lambda: stream.rope(positions, q, k, stream.cos_sin), [positions, qkv]),
        ("gemm_o", lambda: F.linear(x, layer["wo"]), [x]),
        ("gemm_gate_up", lambda: F.linear(x, layer["wgu"]), [x]),
        ("silu_and_mul", lambda: stream.act(gu), [gu]),
        ("gemm_down", lambda: F.linear(a, layer["wd"]), [a]),
    ]


def time_isolated(call, warm: list[torch.Tensor], device: torch.device, method: str) -> float:
    """Median µs of ``call`` timed by replay's :func:`fi_profile.replay.timing.measure` as ``method`` says."""
    timer, inputs = method.split("_", 1)
    measured = measure(call, lambda: None, device, min_time_s=0.05, min_reps=50, timer=timer,
                       warm=warm if inputs == "warm_inputs" else ())
    return statistics.median(measured.times_ms) * 1e3


#: (timer, L2 state of the per-step inputs) as :func:`time_isolated` reads them
METHODS = ("events_cold", "events_warm_inputs", "kernels_cold", "kernels_warm_inputs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64, 512, 2048])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    stream = Stream(args.layers, device)
    rows = []
    print(f"{torch.cuda.get_device_name(device)}; ratio = method / in-stream kernel time")
    print(f"{'op':14} {'tokens':>6} {'stream µs':>10} " + " ".join(f"{m:>19}" for m in METHODS))
    for tokens in args.tokens:
        in_stream = stream_times(stream, tokens, device)
        for op, call, warm in isolated_ops(stream, tokens, device):
            times = {m: time_isolated(call, warm, device, m) for m in METHODS}
            rows.append({"op": op, "tokens": tokens, "stream_us": in_stream[op], "isolated_us": times})
            print(f"{op:14} {tokens:>6} {in_stream[op]:>10.1f} "
                  + " ".join(f"{times[m]:>10.1f} ({times[m] / in_stream[op]:4.2f})" for m in METHODS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), "layers": args.layers, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
