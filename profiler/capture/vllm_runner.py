"""Run a real vLLM engine with capture on, for one fixed scenario."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from profiler.capture.engine_run import (
    Scenario,
    clear_output,
    cpu_thread_binding,
    fail_with_saved_parts,
    prompts_for,
    resolve_model,
    run_info,
)
from profiler.capture.output import CaptureSummary, merge_parts

def build_llm(
    model: str,
    scenario: Scenario,
    *,
    load_format: str = "dummy",
    dtype: str = "bfloat16",
    tp: int = 1,
    eager: bool = True,
    single_process: bool = False,
    capture: bool = True,
    attention_backend: Optional[str] = None,
    gpu_memory_utilization: Optional[float] = None,
    kv_cache_bytes: Optional[int] = None,
) -> Any:
    """A vLLM engine with fi-profile's hooks installed (inactive until ``fi_profile_start``)."""
    source = resolve_model(model)
    os.environ["FI_PROFILE_CAPTURE"] = "1" if capture else "0"
    if source.shipped:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if single_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM

    from hooks.vllm_plugin import register

    register()  # the engine process gets it through the plugin entry point; this one too
    kwargs: dict[str, Any] = {}
    if not torch.cuda.is_available():
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes or (256 << 20)
        if tp == 1:
            kwargs["distributed_executor_backend"] = "uni"
        else:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding(tp))
    if attention_backend:
        kwargs["attention_backend"] = attention_backend
    if gpu_memory_utilization:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    return LLM(
        model=source.path,
        load_format=load_format,
        skip_tokenizer_init=True,
        dtype=dtype,
        tensor_parallel_size=tp,
        enforce_eager=eager,
        seed=scenario.seed,
        max_model_len=scenario.input_len + scenario.output_len + 16,
        max_num_seqs=scenario.batch_size,
        worker_extension_cls="hooks.vllm_plugin.CaptureWorkerExtension",
        **kwargs,
    )


def requests_for(llm: Any, scenario: Scenario) -> tuple[list[Any], Any]:
    """Token-id prompts and sampling parameters of the scenario."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = llm.llm_engine.model_config.get_vocab_size()
    prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts_for(scenario, vocab)]
    params = SamplingParams(
        max_tokens=scenario.output_len,
        ignore_eos=True,
        detokenize=False,
        temperature=scenario.temperature,
        top_k=scenario.top_k if scenario.top_k > 0 else -1,
        top_p=scenario.top_p,
        seed=scenario.seed if scenario.temperature > 0 else None,
    )
    return prompts, params


def run_vllm(
    model: str,
    out_dir: Path,
    scenario: Scenario,
    *,
    max_workloads: int = 32,
    capture: bool = True,
    count_only: bool = False,
    autosave_s: float = 10.0,
    **engine: Any,
) -> tuple[CaptureSummary | None, list[list[int]], dict[str, Any]]:
    """Generate with capture on; returns the merged summary, the generated token ids and run info.
    ``count_only``: calls per Definition only, no workloads (the cheapest capture).

    Each engine process saves its part every ``autosave_s`` seconds; if the engine dies, the parts
    saved so far are merged and :class:`EngineFailed` carries them."""
    llm = build_llm(model, scenario, capture=capture, **engine)
    prompts, params = requests_for(llm, scenario)
    clear_output(out_dir)
    hooks = llm.collective_rpc("fi_profile_start", args=(count_only, str(out_dir), autosave_s)) if capture else []
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        failure = None
    except Exception as exc:  # the engine died (or raised): keep what was saved
        if not capture:
            raise
        outputs, failure = [], f"{type(exc).__name__}: {exc}"
    import vllm

    missing = list({m for h in hooks for m in h["missing"]})
    not_covered: dict[str, int] = {}
    for h in hooks:  # every rank has the same layers (its shard of each)
        for kind, layers in h.get("not_covered", {}).items():
            not_covered[kind] = max(layers, not_covered.get(kind, 0))
    run = run_info(f"vllm {vllm.__version__}", scenario, engine, engine.get("attention_backend") or "default", missing,
                   not_covered)
    run["count_only"] = count_only
    summary = None
    if failure is not None:
        fail_with_saved_parts(out_dir, model, "vLLM", max_workloads, run, failure)
    if capture:
        llm.collective_rpc("fi_profile_stop", args=(str(out_dir),))
        summary = merge_parts(out_dir, model, "vLLM", max_workloads, run)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    del llm
    return summary, tokens, run


