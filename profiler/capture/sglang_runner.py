"""Run a real SGLang engine with capture on, for one fixed scenario (same scenario and output as
the vLLM runner). On CPU it needs ``SGLANG_USE_CPU_ENGINE=1``, which it sets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


def build_engine(model: str, scenario: Scenario, *, load_format: str = "dummy", dtype: str = "bfloat16",
                 tp: int = 1, eager: bool = True, capture: bool = True, attention_backend: str | None = None,
                 gpu_memory_utilization: float | None = None, **_: Any) -> Any:
    """An SGLang Engine with fi-profile's plugin active (recording starts at ``fi_profile_start``).
    Options that only vLLM has (``--single-process``) are ignored."""
    source = resolve_model(model)
    os.environ["FI_PROFILE_CAPTURE"] = "1" if capture else "0"
    if source.shipped:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    cpu = not torch.cuda.is_available()
    if cpu:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        if tp > 1:
            os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", cpu_thread_binding(tp))
    kwargs: dict[str, Any] = dict(
        model_path=source.path, load_format=load_format, skip_tokenizer_init=True, dtype=dtype, tp_size=tp,
        random_seed=scenario.seed, context_length=scenario.input_len + scenario.output_len + 16,
        max_running_requests=scenario.batch_size, disable_cuda_graph=eager, log_level="error",
        sampling_backend="pytorch" if cpu else None,
        attention_backend=attention_backend, mem_fraction_static=gpu_memory_utilization,
    )
    if cpu:
        kwargs.update(device="cpu", attention_backend="torch_native", grammar_backend="none",
                      mem_fraction_static=0.1, max_total_tokens=max(4096, 2 * scenario.num_prompts * (scenario.input_len + scenario.output_len)),
                      disable_overlap_schedule=True)
    from sglang.srt.entrypoints.engine import Engine as engine_class  # sglang.Engine is a lazy proxy

    if capture and hasattr(engine_class, "run_scheduler_process_func"):
        from hooks.sglang_plugin import run_scheduler_process

        class _Engine(engine_class):  # type: ignore[misc, valid-type]
            run_scheduler_process_func = staticmethod(run_scheduler_process)

        engine_class = _Engine
    return engine_class(**{k: v for k, v in kwargs.items() if v is not None})


def run_sglang(model: str, out_dir: Path, scenario: Scenario, *, max_workloads: int = 32, capture: bool = True,
               count_only: bool = False, autosave_s: float = 10.0, **engine: Any) -> tuple[CaptureSummary | None, list[list[int]], dict[str, Any]]:
    """Generate with capture on; returns the merged summary, the generated token ids and run info."""
    llm = build_engine(model, scenario, capture=capture, **engine)
    try:
        clear_output(out_dir)
        if capture:
            llm.collective_rpc("fi_profile_start", count_only=count_only, out_dir=str(out_dir), autosave_s=autosave_s)
        vocab = vocab_size(resolve_model(model).path)
        try:
            outputs = llm.generate(input_ids=prompts_for(scenario, vocab), sampling_params=sampling_params(scenario))
            failure = None
        except Exception as exc:  # the engine died: keep what was saved
            if not capture:
                raise
            outputs, failure = [], f"{type(exc).__name__}: {exc}"
        import sglang

        status = [line for f in (out_dir / ".fi-profile").glob("hooks-*.txt") for line in f.read_text().splitlines()]
        missing = [line.removeprefix("missing ") for line in status if line.startswith("missing ")]
        not_covered: dict[str, int] = {}
        for line in status:
            if line.startswith("not_covered "):
                _, layers, kind = line.split(" ", 2)
                not_covered[kind] = max(int(layers), not_covered.get(kind, 0))
        backend = "torch_native" if not _cuda() else engine.get("attention_backend") or "default"
        run = run_info(f"sglang {sglang.__version__}", scenario, engine, backend, list(set(missing)), not_covered)
        run["count_only"] = count_only
        summary = None
        if failure is not None:
            fail_with_saved_parts(out_dir, model, "SGLang", max_workloads, run, failure)
        if capture:
            llm.collective_rpc("fi_profile_stop", out_dir=str(out_dir))
            summary = merge_parts(out_dir, model, "SGLang", max_workloads, run)
        tokens = [list(o["output_ids"]) for o in outputs]
        return summary, tokens, run
    finally:
        llm.shutdown()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def sampling_params(scenario: Scenario) -> dict[str, Any]:
    """SGLang's sampling parameters for the scenario (every request generates ``output_len`` tokens)."""
    return {"max_new_tokens": scenario.output_len, "ignore_eos": True, "temperature": scenario.temperature,
            "top_k": scenario.top_k if scenario.top_k > 0 else -1, "top_p": scenario.top_p}


def vocab_size(model_path: str) -> int:
    import json

    config = Path(model_path) / "config.json"
    return int(json.loads(config.read_text())["vocab_size"]) if config.is_file() else 32000
