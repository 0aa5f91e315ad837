"""Which step of an engine's config loading rejects a model's ``config.json``, with the whole
traceback (an engine that dies there says one line, and its log may hold nothing): transformers'
``AutoConfig``, then SGLang's own config loading where SGLang is installed. With a second folder, a
Nemotron-H config that fails is also written there without its dense MLP layers (``-`` in
``hybrid_override_pattern``), the same shape otherwise, to tell whether they are the cause.

    python3 benchmarks/config_check.py benchmarks/models/nemotron-h-8b-4layers [/tmp/variant]
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main(folder: str, variant: str = "") -> int:
    import transformers

    print("transformers", transformers.__version__)
    failed = False
    for how in ("AutoConfig", "SGLang"):
        try:
            if how == "AutoConfig":
                config = transformers.AutoConfig.from_pretrained(folder)
            else:
                from sglang.srt.utils.hf_transformers_utils import get_config

                config = get_config(folder, trust_remote_code=False)
            print(how, "loads it as", type(config).__name__)
        except ImportError as exc:
            print(how, "not installed:", exc)
        except Exception:  # noqa: BLE001 - what rejects the config is what this script is for
            failed = True
            print(how, "rejects it:")
            traceback.print_exc(file=sys.stdout)
    if failed and variant:
        config = json.load(open(os.path.join(folder, "config.json")))
        pattern = config.get("hybrid_override_pattern")
        if pattern and "-" in pattern:
            config["hybrid_override_pattern"] = pattern.replace("-", "")
            config["num_hidden_layers"] = len(config["hybrid_override_pattern"])
            os.makedirs(variant, exist_ok=True)
            with open(os.path.join(variant, "config.json"), "w") as out:
                json.dump(config, out, indent=1)
            print("without its MLP layers:", config["hybrid_override_pattern"], "in", variant)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
