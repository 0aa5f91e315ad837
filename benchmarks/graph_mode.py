"""Graph mode against eager, one scenario: are the records equal, and the tokens?

Runs the same scenario three times, each engine in its own process (engines keep global state):
``eager`` (capture, no CUDA graphs / torch.compile), ``graph`` (capture, the engine's defaults) and
``graph-off`` (the engine's defaults without fi-profile: ``FI_PROFILE_CAPTURE=0``, so no hook
is installed). Prints the calls per Definition side by side, how the graph-mode steps ran
(``run.steps.compiled_forward``), the padded sizes, hook errors, and whether the greedy tokens of
``graph`` equal those of ``graph-off`` (transparency) and of ``eager``.

  python benchmarks/graph_mode.py --framework sglang --model meta-llama/Llama-3.1-8B \\
      --num-prompts 32 --input-len 512 --output-len 32 --attention-backend triton --json graph-sglang.json
  python benchmarks/graph_mode.py --framework vllm --model meta-llama/Llama-3.1-8B --tp 2 \\
      --attention-backend TRITON_ATTN --json graph-vllm-tp2.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("eager", "graph", "graph-off")


def run_one(args: argparse.Namespace, mode: str, out: Path) -> dict:
    """One engine run in this process; the result as JSON-able data."""
    from fi_profile.capture.engine_run import Scenario
    from fi_profile.capture.recorder import PARTS_DIR

    if args.framework == "sglang":
        from fi_profile.hooks.sglang.runner import OWN_ARGUMENTS
        from fi_profile.hooks.sglang.runner import run_sglang as run_engine
    else:
        from fi_profile.hooks.vllm.runner import OWN_ARGUMENTS
        from fi_profile.hooks.vllm.runner import run_vllm as run_engine
    from fi_profile.capture.engine_run import parse_engine_args
    from fi_profile.capture.lengths import Length

    scenario = Scenario.of_lengths(Length.parse(args.input_len, "--input-len", 0.0),
                                   Length.parse(args.output_len, "--output-len", 0.0), num_prompts=args.num_prompts)
    options = {"eager": mode == "eager", "tp": args.tp, "attention_backend": args.attention_backend,
               "capture": mode != "graph-off", "gpu_memory_utilization": args.gpu_memory_utilization,
               "engine_args": parse_engine_args(args.engine_arg, OWN_ARGUMENTS)}
    if args.single_process:
        options["single_process"] = True
    summary, tokens, run = run_engine(args.model, out, scenario, **{k: v for k, v in options.items() if v is not None})
    record = summary.record.model_dump(mode="json", exclude_none=True) if summary else None
    parts = sorted((out / PARTS_DIR).glob("*.json"))  # one per engine process that recorded (a TP rank)
    return {"tokens": tokens, "run": run.model_dump(mode="json", exclude_none=True),
            "calls": {k["id"]: k["count"] for k in record["kernels"]} if record else {},
            "calls_per_process": [json.loads(p.read_text())["calls"] for p in parts]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--model", default="fi-profile/tiny-llama")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", default="512", help="N, or MIN:MAX (each request's drawn, seeded)")
    parser.add_argument("--output-len", default="32", help="N, or MIN:MAX")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--attention-backend")
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--single-process", action="store_true", help="vLLM: engine core in the driver process, "
                        "so both runs schedule the same steps")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to the engine's constructor by name, as fi-profile's --engine-arg")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child: one run, JSON on stdout
    args = parser.parse_args()

    if args.one:
        with tempfile.TemporaryDirectory() as out:
            result = run_one(args, args.one, Path(out))
        print("RESULT " + json.dumps(result), flush=True)
        return

    results: dict[str, dict] = {}
    for mode in args.modes.split(","):
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", mode], text=True,
                               stdout=subprocess.PIPE)
        lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
        if child.returncode != 0 or not lines:
            print(f"{mode}: the run failed (exit {child.returncode})", file=sys.stderr)
            continue
        results[mode] = json.loads(lines[-1].removeprefix("RESULT "))
        if args.json:  # after each run: a later one may not finish
            args.json.write_text(json.dumps(results, indent=1))
    report(results)


def report(results: dict[str, dict]) -> None:
    captured = [m for m in ("eager", "graph") if m in results]
    names = sorted({n for m in captured for n in results[m]["calls"]})
    print(f"{'Definition':60s}" + "".join(f"{m:>12s}" for m in captured))
    for name in names:
        print(f"{name:60s}" + "".join(f"{results[m]['calls'].get(name, 0):12d}" for m in captured))
    print(f"{'total':60s}" + "".join(f"{sum(results[m]['calls'].values()):12d}" for m in captured))
    for mode in captured:
        run = results[mode]["run"]
        print(f"{mode}: steps {run.get('steps')}; padded_tokens {run.get('padded_tokens')}; "
              f"hook errors {run.get('hook_errors') or 'none'}; incomplete {run.get('incomplete')}")
    for mode in captured:
        ranks = results[mode]["calls_per_process"]
        if len(ranks) > 1:
            summed = {n: sum(r.get(n, 0) for r in ranks) for n in results[mode]["calls"]}
            print(f"{mode}: {len(ranks)} processes recorded, calls {[sum(r.values()) for r in ranks]}; "
                  f"every process the same Definitions and counts: {all(r == ranks[0] for r in ranks)}; "
                  f"the record is their sum: {summed == results[mode]['calls']}")
    if len(captured) == 2:
        same = results["eager"]["calls"] == results["graph"]["calls"]
        print(f"counts per Definition, eager == graph: {same}")
        compare_schedules(results["eager"]["run"].get("schedule", []), results["graph"]["run"].get("schedule", []))
    if "graph" in results and "graph-off" in results:
        print(f"greedy tokens, graph with capture == graph without fi-profile: "
              f"{results['graph']['tokens'] == results['graph-off']['tokens']}")
    if "graph" in results and "eager" in results:
        print(f"greedy tokens, graph == eager: {results['graph']['tokens'] == results['eager']['tokens']}")


def compare_schedules(eager: list, graph: list) -> None:
    """The two runs' steps side by side (``run.schedule``), from the first one that differs."""
    def steps(schedule: list) -> list[tuple]:
        return [tuple(entry[:4]) for entry in schedule for _ in range(entry[4])]

    a, b = steps(eager), steps(graph)
    prefills = [sum(1 for s in x if s[3]) for x in (a, b)]
    print(f"steps: eager {len(a)}, graph {len(b)}; steps with prefill: eager {prefills[0]}, graph {prefills[1]}")
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    if first is None:
        print("schedules: identical, step by step")
        return
    print(f"schedules differ from step {first} (tokens, requests, decoding, prefilling):")
    for i in range(first, min(first + 8, max(len(a), len(b)))):
        print(f"  step {i}: eager {a[i] if i < len(a) else '-'}  graph {b[i] if i < len(b) else '-'}")


if __name__ == "__main__":
    main()
