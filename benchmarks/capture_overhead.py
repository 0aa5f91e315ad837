"""Capture overhead in one engine: generate tokens/s with capture off, count-only, full, and full
with the engine's kernels accounted for (``--accounting``, single process: torch.profiler over the
generate, the ranges around each hooked call; the attribution after it is timed on its own).

One engine (vLLM, or SGLang with ``--framework sglang``) is built with fi-profile's hooks installed.
Each round runs the same generate three
times: capture off (hooks installed, recorder inactive: each hook costs a flag test), count-only
(calls counted per Definition) and full (plus distinct var-axis values and index tensors). The
order rotates each round so that drift does not favour one mode. Medians are reported.

  python benchmarks/capture_overhead.py --model fi-profile/tiny-llama --rounds 3
  python benchmarks/capture_overhead.py --model meta-llama/Llama-3.1-8B --attention-backend TRITON_ATTN \\
      --num-prompts 32 --input-len 256 --output-len 64 --json overhead.json
  python benchmarks/capture_overhead.py --framework sglang --model meta-llama/Llama-3.1-8B \\
      --attention-backend triton --json overhead-sglang.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from fi_profile.capture import kernel_accounting
from fi_profile.capture.engine_run import Scenario

MODES = ("off", "count", "full")
ACCOUNTED = "accounted"


def build_engine(args: argparse.Namespace, scenario: Scenario):
    """The runner's own engine (hooks installed, recorder inactive until ``start``)."""
    from fi_profile.capture.engine_run import parse_engine_args
    from fi_profile.capture.options import EngineOptions, engine_runner

    runner = engine_runner(args.framework)
    engine_args = parse_engine_args(args.engine_arg, runner.OWN_ARGUMENTS)
    options = EngineOptions(attention_backend=args.attention_backend, eager=not args.no_eager,
                            single_process=args.single_process, engine_args=engine_args)
    return runner.ENGINE(args.model, scenario, options)


def profile_one_generate(engine, generate, mode: str, out: Path) -> None:
    import cProfile
    import pstats

    engine.start(mode == "count", None)
    profiler = cProfile.Profile()
    profiler.enable()
    generate()
    profiler.disable()
    engine.stop(out)
    stats = pstats.Stats(profiler)
    ours = [(fn, row) for fn, row in stats.stats.items() if "fi_profile" in fn[0] or "/hooks/" in fn[0]]
    print(f"cProfile of one {mode} generate: fi-profile's functions by total time (calls, tottime s, cumtime s)")
    for (file, line, name), (_, calls, tottime, cumtime, _) in sorted(ours, key=lambda kv: -kv[1][2])[:25]:
        print(f"  {calls:8d} {tottime:8.4f} {cumtime:8.4f}  {Path(file).name}:{line} {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--model", default="fi-profile/tiny-llama")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attention-backend")
    parser.add_argument("--no-eager", action="store_true")
    parser.add_argument(
        "--single-process", action="store_true",
        help="engine core in this process: every request is queued before the first step, so each "
        "generate schedules the same steps (multi-process vLLM receives them one by one over ZMQ); vLLM only",
    )
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to the engine's constructor by name, as fi-profile's --engine-arg")
    parser.add_argument("--accounting", action="store_true",
                        help="a fourth mode: full capture with the engine's kernels accounted for (with --single-process)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cprofile", choices=("count", "full"),
                        help="after the rounds, one more generate in this mode under cProfile (with --single-process "
                        "the engine runs in this process): fi-profile's own functions, by total time")
    args = parser.parse_args()

    scenario = Scenario(num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len)
    engine = build_engine(args, scenario)

    def generate() -> int:
        return sum(len(tokens) for tokens in engine.generate(scenario))

    for _ in range(2):  # warm-up: JIT, allocator; on H100 vLLM's second generate in graph mode still took 2.4x
        generate()
    modes = (*MODES, ACCOUNTED) if args.accounting else MODES
    times: dict[str, list[float]] = {m: [] for m in modes}
    processing: list[float] = []
    calls: dict[str, int] = {}
    steps: dict[str, dict[str, int]] = {}
    generated = 0
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = modes[round_index % len(modes) :] + modes[: round_index % len(modes)]
            for mode in order:
                os.environ[kernel_accounting.ENV] = "0.95" if mode == ACCOUNTED else "0"  # read at start
                if mode != "off":
                    engine.start(mode == "count", None)
                began = time.perf_counter()
                generated = generate()
                times[mode].append(time.perf_counter() - began)
                if mode != "off":
                    engine.stop(Path(tmp))
                    part = json.loads(next((Path(tmp) / ".fi-profile" / "parts").glob("*.json")).read_text())
                    calls[mode] = sum(part["calls"].values())
                    steps[mode] = part["steps"]
                    if part.get("engine_kernels"):
                        processing.append(part["engine_kernels"]["processing_s"])
        if args.cprofile:
            profile_one_generate(engine, generate, args.cprofile, Path(tmp))
    engine.shutdown()
    import torch

    import fi_profile.capture.patching

    tokens_per_s = {m: generated / statistics.median(t) for m, t in times.items()}
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "engine": engine.version,
        "model": args.model,
        "attention_backend": args.attention_backend or "default",
        "eager": not args.no_eager,
        "scenario": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "generated_tokens": generated,
        "nvtx": fi_profile.capture.patching._push is not None,
        "hooked_calls_per_generate": calls,
        "steps_learned_replayed": steps,
        "seconds": times,
        "tokens_per_s": tokens_per_s,
        "loss_vs_off": {m: 1 - tokens_per_s[m] / tokens_per_s["off"] for m in modes if m != "off"},
        #: seconds the accounting took after each accounted generate to attribute its profile
        "accounting_processing_s": processing,
        # the spread of the capture-off runs themselves: a loss below it is not measurable
        "cv_off": statistics.stdev(times["off"]) / statistics.mean(times["off"]) if len(times["off"]) > 1 else None,
        # each round's modes ran back to back: the median of per-round ratios cancels slow drift
        "paired_loss_vs_off": {
            m: statistics.median(1 - off / t for off, t in zip(times["off"], times[m])) for m in modes if m != "off"
        },
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
