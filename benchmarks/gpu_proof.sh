#!/usr/bin/env bash
# One model's GPU proof in one engine, as the issues ask for it: a capture in graph mode (the
# engine's defaults) and one eager, their calls per Definition compared, and a replay of the graph
# capture (cold caches, the replay's defaults). What comes back is small: under $OUT, per model and
# engine, the terminal output of each command, both records, the counts compared, and the replay's
# results and report; the captures themselves stay in $WORK.
#
#   source .gpu/<bundle>/setup.sh .gpu/<wheel>      # the device machine, from the project root
#   bash benchmarks/gpu_proof.sh vllm benchmarks/models/qwen3-next-80b-tp4-rank-4layers \
#       --engine-arg 'additional_config={"gdn_prefill_backend": "triton"}'
#   bash benchmarks/gpu_proof.sh sglang ../models/gemma-3-27b-6l
#
# Options after the model go to both captures. Environment: OUT (default gpu-proof), WORK (default
# /tmp/gpu-proof), BACKEND (the attention backend), MODES ("graph eager"), SCENARIO (the requests), CAPTURE_LIMIT_S (300 each),
# REPLAY_LIMIT_S (180), MAX_WORKLOADS (3), REPLAY_ARGS (more replay options), REPLAY_MATCHING (an
# extended regex: replay only the record's Definitions whose id matches it; REPLAY=0: no replay). A
# stage that fails or runs out of time is said in summary.txt, and the next one still runs.
set -uo pipefail
engine=$1 model=$2
shift 2
source "$(dirname "$0")/gpu_run.sh" gpu-proof
case $engine in  # the bundles' attention backends (no FlashAttention in them); BACKEND=default: the engine's
  vllm) backend=(--attention-backend "${BACKEND:-TRITON_ATTN}") ;;
  sglang) backend=(--attention-backend "${BACKEND:-triton}") ;;
  *) echo "engine: vllm or sglang, not $engine" >&2; exit 2 ;;
esac
[ "${BACKEND:-}" = default ] && backend=()
read -r -a scenario <<< "${SCENARIO:---num-prompts 16 --input-len 64:512 --output-len 8:32}"

for mode in ${MODES:-graph eager}; do
  flags=()
  [ "$mode" = eager ] && flags=(--eager)
  start=$SECONDS
  timeout "${CAPTURE_LIMIT_S:-300}" fi-profile --model "$model" --framework "$engine" "${backend[@]}" "${flags[@]}" \
    "${scenario[@]}" "$@" --out "$work/capture-$mode" > "$out/capture-$mode.txt" 2>&1
  status=$?
  say "capture $mode: exit $status in $((SECONDS - start)) s"
  [ $status = 0 ] || tail -n 200 "$work/capture-$mode/engine.log" > "$out/engine-$mode.log" 2>/dev/null
  cp "$work/capture-$mode/record.json" "$out/record-$mode.json" 2>/dev/null
done

if [ -f "$out/record-graph.json" ] && [ -f "$out/record-eager.json" ]; then
  python3 - "$out/record-graph.json" "$out/record-eager.json" <<'PY' | tee -a "$out/summary.txt"
import json, sys
graph, eager = ({k["id"]: k["count"] for k in json.load(open(p))["kernels"]} for p in sys.argv[1:])
differ = sorted(d for d in set(graph) | set(eager) if graph.get(d) != eager.get(d))
print(f"graph vs eager: {len(graph)} and {len(eager)} Definitions, {len(differ)} with other counts")
for d in differ:
    print(f"  {d}: graph {graph.get(d)}, eager {eager.get(d)}")
PY
fi

if [ "${REPLAY:-1}" != 0 ] && [ -f "$work/capture-graph/record.json" ]; then
  start=$SECONDS
  read -r -a more <<< "${REPLAY_ARGS:-}"
  if [ -n "${REPLAY_MATCHING:-}" ]; then
    chosen=$(python3 -c 'import json, sys; print(",".join(k["id"] for k in json.load(open(sys.argv[1]))["kernels"]))' \
      "$work/capture-graph/record.json" | tr , '\n' | grep -E "$REPLAY_MATCHING" | paste -sd, -)
    say "replayed Definitions: ${chosen:-none match $REPLAY_MATCHING}"
    more+=(--definitions "$chosen")
  fi
  timeout "${REPLAY_LIMIT_S:-180}" fi-profile replay "$work/capture-graph" --max-workloads "${MAX_WORKLOADS:-3}" \
    "${more[@]}" --out "$work/results" > "$out/replay.txt" 2>&1
  say "replay: exit $? in $((SECONDS - start)) s"
  for f in results.jsonl time_breakdown.json report.html; do
    cp "$work/results/$f" "$out/" 2>/dev/null
  done
fi
