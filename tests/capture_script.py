"""Run one capture (vLLM; SGLang with ``"framework": "sglang"``) in a fresh process: engines keep
global state, and on some failures kill their parent. argv[1]: JSON of the runner's arguments.
Prints ``RESULT <json>`` as its last line.

Test-only fault injection: FI_PROFILE_TEST_FAULT=<op function> makes that op-table function raise,
in this process and in every process spawned from it (a spawned child runs this module's top level
as ``__mp_main__``: that is how the fault reaches SGLang's scheduler);
FI_PROFILE_TEST_FAULT=kill-engine SIGKILLs the engine process once its part has 3 steps saved.
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


def break_op(name: str) -> None:
    from profiler.capture import ops

    def broken(*_, **__):
        raise RuntimeError(f"injected fault in {name}")

    setattr(ops, name, broken)


FAULT = os.environ.get("FI_PROFILE_TEST_FAULT", "")
if FAULT and FAULT != "kill-engine":
    break_op(FAULT)


def main() -> None:
    args = json.loads(sys.argv[1])
    if FAULT == "kill-engine":
        threading.Thread(target=kill_engine_once_saved, args=(Path(args["out_dir"]),), daemon=True).start()
    from profiler.capture.engine_run import EngineFailed, Scenario
    from profiler.capture.vllm_runner import run_vllm

    scenario = Scenario(**args.pop("scenario"))
    run_engine = run_vllm
    if args.pop("framework", "vllm") == "sglang":
        from profiler.capture.sglang_runner import run_sglang as run_engine
    try:
        summary, tokens, run = run_engine(args.pop("model"), Path(args.pop("out_dir")), scenario, **args)
    except EngineFailed as failed:
        summary, tokens, run = failed.summary, [], failed.run
    result = {"tokens": tokens, "run": run, "record": summary.record.model_dump(mode="json") if summary else None}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
