#!/usr/bin/env bash
# The user's command, as README gives it, then `fi-profile replay` with no options from cold
# caches, at the width of a log (COLUMNS=80): issue 44's GPU proof. What comes back under $OUT/NAME
# is small: both commands' terminal output, the record, the replay's results, time breakdown and
# report; the capture itself stays in $WORK.
#
#   source .gpu/<bundle>/setup.sh .gpu/<wheel>      # the device machine, from the project root
#   bash benchmarks/user_command.sh sglang meta-llama/Llama-3.1-8B --attention-backend triton
#   bash benchmarks/user_command.sh vllm meta-llama/Llama-3.1-8B --attention-backend TRITON_ATTN
#
# Options after the model go to the capture only (the bundles have no FlashAttention: the backend).
# Environment: OUT (default user-command), WORK (default /tmp/user-command), CAPTURE_LIMIT_S (300),
# REPLAY_LIMIT_S (300). One engine per machine (benchmarks/gpu_run.sh says why).
set -uo pipefail
engine=$1 model=$2
shift 2
source "$(dirname "$0")/gpu_run.sh" user-command

start=$SECONDS
COLUMNS=80 timeout "${CAPTURE_LIMIT_S:-300}" fi-profile --model "$model" --framework "$engine" "$@" \
  --out "$work/capture" > "$out/capture.txt" 2>&1
say "capture: exit $? in $((SECONDS - start)) s"
cp "$work/capture/record.json" "$out/" 2>/dev/null
[ -f "$work/capture/record.json" ] || { tail -n 200 "$work/capture/engine.log" > "$out/engine.log" 2>/dev/null; exit 1; }

start=$SECONDS
COLUMNS=80 timeout "${REPLAY_LIMIT_S:-300}" fi-profile replay "$work/capture" --out "$work/results" > "$out/replay.txt" 2>&1
say "replay: exit $? in $((SECONDS - start)) s"
for f in results.jsonl time_breakdown.json report.html; do
  cp "$work/results/$f" "$out/" 2>/dev/null
done
