"""Drive a real vLLM engine with fi-profile's hooks installed (the :class:`Engine` that
:func:`fi_profile.capture.engine_run.run_capture` runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from fi_profile.capture.engine_run import (
    HookStatus,
    Scenario,
    cpu_thread_binding,
    engine_model,
    prompts_for,
    run_capture,
)
from fi_profile.capture.options import CaptureOptions, EngineOptions

WORKER_EXTENSION = "fi_profile.hooks.vllm.plugin.CaptureWorkerExtension"

#: ``vllm.LLM`` arguments that fi-profile sets itself: not taken from ``--engine-arg``
OWN_ARGUMENTS = {
    "model": "--model", "load_format": "--load-format", "dtype": "--dtype", "tensor_parallel_size": "--tp",
    "enforce_eager": "--eager / --no-eager", "seed": "--seed", "max_num_seqs": "--batch-size",
    "attention_backend": "--attention-backend", "gpu_memory_utilization": "--gpu-memory-utilization",
    "skip_tokenizer_init": "prompts are token ids", "worker_extension_cls": "fi-profile's hooks",
}


class VllmEngine:
    """A vLLM ``LLM`` with the hooks installed in every engine process (inactive until ``start``)."""

    framework = "vLLM"

    def __init__(self, model: str, scenario: Scenario, options: EngineOptions, capture: bool = True) -> None:
        source = engine_model(model, capture)
        tp, eager, attention_backend = options.tp, options.eager, options.attention_backend
        if options.single_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if capture and not eager:
            # the hooks record compiled code while Dynamo traces it: a forward loaded from vLLM's
            # compile cache is never traced (what gets compiled is the same; it is compiled again)
            os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
        import torch
        import vllm

        from fi_profile.hooks.vllm.plugin import register

        register()  # the engine processes get it through the plugin entry point; this one too
        kwargs: dict[str, Any] = {}
        if not torch.cuda.is_available():
            kwargs["kv_cache_memory_bytes"] = options.kv_cache_bytes or (256 << 20)
            if tp == 1:
                kwargs["distributed_executor_backend"] = "uni"
            else:
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding(tp))
        if attention_backend:
            kwargs["attention_backend"] = attention_backend
        if options.gpu_memory_utilization:
            kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        self.version = f"vllm {vllm.__version__}"
        self.attention_backend = attention_backend or "default"
        arguments: dict[str, Any] = dict(
            model=source.path,
            load_format=options.load_format,
            skip_tokenizer_init=True,
            dtype=options.dtype,
            tensor_parallel_size=tp,
            enforce_eager=eager,
            seed=scenario.seed,
            max_model_len=scenario.input_len + scenario.output_len + 16,
            max_num_seqs=scenario.batch_size,
            worker_extension_cls=WORKER_EXTENSION,
            **kwargs,
        )
        arguments.update(options.engine_args)  # the user's own engine arguments, by name, last
        self.llm = vllm.LLM(**arguments)

    def requests(self, scenario: Scenario) -> tuple[list[Any], list[Any]]:
        """Token-id prompts and each request's sampling parameters (its output length)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts_for(scenario, vocab)]
        params = [
            SamplingParams(
                max_tokens=n,
                ignore_eos=True,
                detokenize=False,
                temperature=scenario.temperature,
                top_k=scenario.top_k if scenario.top_k > 0 else -1,
                top_p=scenario.top_p,
                seed=scenario.seed if scenario.temperature > 0 else None,
            )
            for n in scenario.output_lengths()
        ]
        return prompts, params

    def start(self, count_only: bool, out_dir: Optional[Path], autosave_s: float = 10.0) -> HookStatus:
        ranks = self.llm.collective_rpc(
            "fi_profile_start", args=(count_only, str(out_dir) if out_dir else None, autosave_s)
        )
        return HookStatus.of_ranks([HookStatus(r["missing"], r.get("not_covered", {}), r.get("inexact", {}),
                                               r.get("dummy_biases_zeroed", 0)) for r in ranks])

    def generate(self, scenario: Scenario) -> list[list[int]]:
        prompts, params = self.requests(scenario)
        return [list(o.outputs[0].token_ids) for o in self.llm.generate(prompts, params, use_tqdm=False)]

    def stop(self, out_dir: Path) -> None:
        self.llm.collective_rpc("fi_profile_stop", args=(str(out_dir),))

    def save(self, out_dir: Path) -> None:
        self.llm.collective_rpc("fi_profile_save", args=(str(out_dir),))

    def shutdown(self) -> None:
        self.llm = None  # vLLM shuts its engine processes down when the LLM is collected


#: this engine, as :data:`fi_profile.capture.options.ENGINE_RUNNERS` finds it
ENGINE = VllmEngine


def run_vllm(model: str, out_dir: Path, scenario: Scenario, **options: Any) -> Any:
    """:func:`run_capture` of this engine with ``options`` by name (:meth:`CaptureOptions.of`)."""
    return run_capture(ENGINE, CaptureOptions.of(model, out_dir, scenario, **options))
