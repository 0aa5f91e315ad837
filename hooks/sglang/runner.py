"""Drive a real SGLang engine with fi-profile's plugin active (the :class:`Engine` that
:func:`fi_profile.capture.engine_run.run_capture` runs). On CPU it needs
``SGLANG_USE_CPU_ENGINE=1``, which it sets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
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

#: ``sglang.Engine`` arguments that fi-profile sets itself: not taken from ``--engine-arg``
OWN_ARGUMENTS = {
    "model_path": "--model", "load_format": "--load-format", "dtype": "--dtype", "tp_size": "--tp",
    "disable_cuda_graph": "--eager / --no-eager", "random_seed": "--seed", "max_running_requests": "--batch-size",
    "attention_backend": "--attention-backend", "mem_fraction_static": "--gpu-memory-utilization",
    "skip_tokenizer_init": "prompts are token ids",
}


class SglangEngine:
    """An SGLang ``Engine`` whose scheduler has the hooks (recording starts at ``start``).
    Options that only vLLM has (``single_process``, ``kv_cache_bytes``) are ignored."""

    framework = "SGLang"

    def __init__(self, model: str, scenario: Scenario, options: EngineOptions, capture: bool = True) -> None:
        source = engine_model(model, capture)
        tp = options.tp
        import torch

        cpu = not torch.cuda.is_available()
        if cpu:
            os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
            if tp > 1:
                os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", cpu_thread_binding(tp))
        kwargs: dict[str, Any] = dict(
            model_path=source.path,
            load_format=options.load_format,
            skip_tokenizer_init=True,
            dtype=options.dtype,
            tp_size=tp,
            random_seed=scenario.seed,
            context_length=scenario.input_len + scenario.output_len + 16,
            max_running_requests=scenario.batch_size,
            disable_cuda_graph=options.eager,
            log_level="error",
            sampling_backend="pytorch" if cpu else None,
            attention_backend=options.attention_backend,
            mem_fraction_static=options.gpu_memory_utilization,
        )
        if cpu:
            kwargs.update(
                device="cpu",
                attention_backend="torch_native",
                grammar_backend="none",
                mem_fraction_static=0.1,
                max_total_tokens=max(4096, 2 * scenario.num_prompts * (scenario.input_len + scenario.output_len)),
                disable_overlap_schedule=True,
            )
        import inspect

        from sglang.srt.server_args import ServerArgs  # a dataclass in 0.5.16, a msgspec Struct in 0.5.23

        if "custom_sigquit_handler" in inspect.signature(ServerArgs).parameters:
            kwargs["custom_sigquit_handler"] = engine_process_failed
        kwargs.update(options.engine_args)  # the user's own engine arguments, by name, last
        from sglang.srt.entrypoints.engine import Engine as engine_class  # sglang.Engine is a lazy proxy

        if capture and hasattr(engine_class, "run_scheduler_process_func"):
            from fi_profile.hooks.sglang.plugin import run_scheduler_process

            class _Engine(engine_class):  # type: ignore[misc, valid-type]
                run_scheduler_process_func = staticmethod(run_scheduler_process)

            engine_class = _Engine
        import sglang

        self.version = f"sglang {sglang.__version__}"
        self.attention_backend = kwargs["attention_backend"] or "default"
        self.model_path = source.path
        self.engine = engine_class(**{k: v for k, v in kwargs.items() if v is not None})

    def start(self, count_only: bool, out_dir: Optional[Path], autosave_s: float = 10.0) -> HookStatus:
        self.engine.collective_rpc(
            "fi_profile_start", count_only=count_only, out_dir=str(out_dir) if out_dir else None, autosave_s=autosave_s
        )
        if out_dir is None:
            return HookStatus()
        ranks = []  # collective_rpc returns no value: each scheduler wrote what it found
        for status in (out_dir / ".fi-profile").glob("hooks-*.txt"):
            rank = HookStatus()
            for line in status.read_text().splitlines():
                if line.startswith("missing "):
                    rank.missing.append(line.removeprefix("missing "))
                elif line.startswith("not_covered "):
                    _, layers, kind = line.split(" ", 2)
                    rank.not_covered[kind] = int(layers)
                elif line.startswith("dummy_biases_zeroed "):
                    rank.dummy_biases_zeroed = int(line.split()[1])
            ranks.append(rank)
        return HookStatus.of_ranks(ranks)

    def generate(self, scenario: Scenario) -> list[list[int]]:
        self._reclaim_signals()
        prompts = prompts_for(scenario, vocab_size(self.model_path))
        params = [sampling_params(scenario, n) for n in scenario.output_lengths()]
        try:
            outputs = self.engine.generate(input_ids=prompts, sampling_params=params)
        except _FailedInTheLoop as failed:
            raise EngineProcessFailed(str(failed)) from None
        return [list(o["output_ids"]) for o in outputs]

    def _reclaim_signals(self) -> None:
        """SGLang's tokenizer manager, at its first request, takes SIGTERM and SIGQUIT on its event
        loop: SIGTERM to drain every request before it stops, SIGQUIT (a scheduler failed) to kill
        its process tree, fi-profile with it, leaving no record. Its loop is made here first, on the
        engine's own event loop, then its handlers removed and fi-profile's put back: SIGTERM and
        SIGINT stop the capture keeping its record, and SIGQUIT says the engine failed keeping what
        its processes saved (:func:`engine_process_failed`)."""
        from fi_profile.capture.interruption import reclaim_signals

        create = getattr(getattr(self.engine, "tokenizer_manager", None), "auto_create_handle_loop", None)
        if create is None:
            return

        async def on_the_engines_loop() -> None:  # outside a running loop, SGLang makes a new one
            create()

        loop = self.engine.loop
        loop.run_until_complete(on_the_engines_loop())
        for taken in (signal.SIGTERM, signal.SIGQUIT):
            with contextlib.suppress(Exception):  # not taken there (not the main thread): nothing to undo
                loop.remove_signal_handler(taken)
        reclaim_signals()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGQUIT, engine_process_failed)

    def stop(self, out_dir: Path) -> None:
        self.engine.collective_rpc("fi_profile_stop", out_dir=str(out_dir))

    def save(self, out_dir: Path) -> None:
        self.engine.collective_rpc("fi_profile_save", out_dir=str(out_dir))

    def shutdown(self) -> None:
        self.engine.shutdown()


class EngineProcessFailed(RuntimeError):
    """An SGLang engine process failed and said so to fi-profile's (SIGQUIT)."""


class _FailedInTheLoop(KeyboardInterrupt):
    """:class:`EngineProcessFailed` raised inside SGLang's event loop while it generates: uvloop
    runs a signal handler in a callback of its own and swallows an Exception raised there (the
    capture hung), letting only a KeyboardInterrupt out. ``generate`` says it as the failure."""


def engine_process_failed(signum: int, frame: Any) -> None:
    """SGLang's processes send SIGQUIT to the one that launched them when one fails; SGLang's own
    handler then kills that process too, fi-profile with it, without a word. This one stops the
    engine's processes and raises here instead, so that the capture says the engine failed and
    where its output is (``DIR/engine.log``). While a signal stops the capture it does nothing:
    the engine's processes the signal reached too exit saving their steps."""
    from sglang.srt.utils import kill_process_tree

    from fi_profile.capture.interruption import stopping

    if stopping():  # the signal reached the engine's processes too: they save their steps as they exit
        return
    kill_process_tree(os.getpid(), include_parent=False)
    said = "an SGLang engine process failed (it signalled fi-profile with SIGQUIT)"
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # launching: no loop runs
        raise EngineProcessFailed(said) from None
    raise _FailedInTheLoop(said)


#: this engine, as :data:`fi_profile.capture.options.ENGINE_RUNNERS` finds it
ENGINE = SglangEngine


def run_sglang(model: str, out_dir: Path, scenario: Scenario, **options: Any) -> Any:
    """:func:`run_capture` of this engine with ``options`` by name (:meth:`CaptureOptions.of`)."""
    return run_capture(ENGINE, CaptureOptions.of(model, out_dir, scenario, **options))


def sampling_params(scenario: Scenario, output_len: int) -> dict[str, Any]:
    """SGLang's sampling parameters for one request of the scenario (``output_len`` new tokens)."""
    return {
        "max_new_tokens": output_len,
        "ignore_eos": True,
        "temperature": scenario.temperature,
        "top_k": scenario.top_k if scenario.top_k > 0 else -1,
        "top_p": scenario.top_p,
    }


def vocab_size(model_path: str) -> int:
    config = Path(model_path) / "config.json"
    return int(json.loads(config.read_text())["vocab_size"]) if config.is_file() else 32000
