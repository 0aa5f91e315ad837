"""Capture overhead in one engine: generate tokens/s with capture off, count-only and full.

One vLLM engine is built with fi-profile's hooks installed. Each round runs the same generate three
times: capture off (hooks installed, recorder inactive: each hook costs a flag test), count-only
(calls counted per Definition) and full (plus distinct var-axis values and index tensors). The
order rotates each round so that drift does not favour one mode. Medians are reported.

  python benchmarks/capture_overhead.py --model fi-profile/tiny-llama --rounds 3
  python benchmarks/capture_overhead.py --model meta-llama/Llama-3.1-8B --attention-backend TRITON_ATTN \\
      --num-prompts 32 --input-len 256 --output-len 64 --json overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from profiler.capture.engine_run import Scenario
from profiler.capture.vllm_runner import build_llm, requests_for

MODES = ("off", "count", "full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        "generate schedules the same steps (multi-process vLLM receives them one by one over ZMQ)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    scenario = Scenario(num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len)
    llm = build_llm(
        args.model, scenario, attention_backend=args.attention_backend, eager=not args.no_eager,
        single_process=args.single_process,
    )
    prompts, params = requests_for(llm, scenario)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: JIT, allocator
    times: dict[str, list[float]] = {m: [] for m in MODES}
    calls: dict[str, int] = {}
    steps: dict[str, dict[str, int]] = {}
    generated = 0
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = MODES[round_index % 3 :] + MODES[: round_index % 3]
            for mode in order:
                if mode != "off":
                    llm.collective_rpc("fi_profile_start", args=(mode == "count",))
                start = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False)
                times[mode].append(time.perf_counter() - start)
                generated = sum(len(o.outputs[0].token_ids) for o in outputs)
                if mode != "off":
                    llm.collective_rpc("fi_profile_stop", args=(tmp,))
                    part = json.loads(next((Path(tmp) / ".fi-profile" / "parts").glob("*.json")).read_text())
                    calls[mode] = sum(part["calls"].values())
                    steps[mode] = part["steps"]
    import torch
    import vllm

    import hooks.patching

    tokens_per_s = {m: generated / statistics.median(t) for m, t in times.items()}
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "engine": f"vllm {vllm.__version__}",
        "model": args.model,
        "attention_backend": args.attention_backend or "default",
        "eager": not args.no_eager,
        "scenario": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "generated_tokens": generated,
        "nvtx": hooks.patching._push is not None,
        "hooked_calls_per_generate": calls,
        "steps_learned_replayed": steps,
        "seconds": times,
        "tokens_per_s": tokens_per_s,
        "loss_vs_off": {m: 1 - tokens_per_s[m] / tokens_per_s["off"] for m in ("count", "full")},
        # each round's modes ran back to back: the median of per-round ratios cancels slow drift
        "paired_loss_vs_off": {
            m: statistics.median(1 - off / t for off, t in zip(times["off"], times[m])) for m in ("count", "full")
        },
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
