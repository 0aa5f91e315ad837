"""Run one vLLM capture in a fresh process (vLLM keeps global state; on failure it may kill its
parent). argv[1]: JSON of run_vllm arguments. Prints ``RESULT <json>`` as its last line.

Test-only fault injection: FI_PROFILE_TEST_FAULT=<op function> makes that op-table function raise.
"""

import json
import os
import sys
from pathlib import Path


def main() -> None:
    args = json.loads(sys.argv[1])
    fault = os.environ.get("FI_PROFILE_TEST_FAULT")
    if fault:
        from profiler.capture import ops

        def broken(*_, **__):
            raise RuntimeError(f"injected fault in {fault}")

        setattr(ops, fault, broken)
    from profiler.capture.vllm_runner import Scenario, run_vllm

    scenario = Scenario(**args.pop("scenario"))
    summary, tokens, run = run_vllm(args.pop("model"), Path(args.pop("out_dir")), scenario, **args)
    result = {"tokens": tokens, "run": run, "record": summary.record.model_dump(mode="json") if summary else None}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
