"""Compare two capture folders (or two folders of captures and replays) file by file.

Captures byte for byte (record, Definitions, workloads, index tensors); the terminal output of a
capture or replay with its folder, durations and widths masked; a replay's results without their
timings. What a refactor must leave as it was (issue 21):

    python benchmarks/compare_captures.py BEFORE AFTER
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

#: fields of a Benchmark Result that depend on the timing
TIMED = {"time", "speedup", "timing", "reference_time", "baseline_speedup"}
#: files written with timings or by the engine itself
SKIPPED = {"engine.log", "ray.log", "time_breakdown.json"}


def _terminal(text: str, root: Path) -> str:
    text = text.replace(str(root), "DIR")
    for pattern, mask in ((r"\d+ s \(engine output", "N s (engine output"), (r"\d+\.\d+", "X"), (r"in \d+ ?s\b", "in N s"),
                          (r"\d+ pairs/min", "P pairs/min"), (r"\d+:\d+:\d+", "T"), (r"[ ─━]+", " ")):
        text = re.sub(pattern, mask, text)
    return text


def _results(text: str) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMED} for line in text.splitlines()]


def same(a: Path, b: Path, root_a: Path, root_b: Path) -> bool:
    if a.suffix in (".stdout", ".stderr"):
        return _terminal(a.read_text(), root_a) == _terminal(b.read_text(), root_b)
    if a.name == "results.jsonl":
        return _results(a.read_text()) == _results(b.read_text())
    return a.read_bytes() == b.read_bytes()


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")
            if p.is_file() and ".fi-profile" not in p.relative_to(root).parts and p.name not in SKIPPED}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = _files(args.before), _files(args.after)
    differ = [rel for rel in sorted(before & after) if not same(args.before / rel, args.after / rel, args.before, args.after)]
    for rel in differ:
        print(f"differs: {rel}")
    for rel in sorted(before - after):
        print(f"only in {args.before}: {rel}")
    for rel in sorted(after - before):
        print(f"only in {args.after}: {rel}")
    problems = len(differ) + len(before ^ after)
    print(f"{len(before)} files compared, {problems} differ")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
