# Sourced by benchmarks/gpu_proof.sh and user_command.sh after `engine=... model=...`, with the
# default folder's name as $1: sets $name, $out (under $OUT) and $work (under $WORK), refuses a
# machine that holds the other engine's bundle, defines `say` (to the terminal and
# $out/summary.txt) and says which card this is.
name=$(basename "$model")-$engine
out=${OUT:-$1}/$name
work=${WORK:-/tmp/$1}/$name
# Both bundles install into /tmp/site, and a bundle's setup on a machine that already holds the other's
# keeps the other's wheels and stubs (its stubs are copied once): seen 2026-12-06, vLLM's xgrammar stub
# then stopped SGLang's Llama at start, and SGLang's MoE natives failed to build. One engine per machine.
other=$([ "$engine" = sglang ] && echo /tmp/vllmpkg || echo /tmp/sglpkg)
if [ -d "$other" ]; then
  echo "$other: this machine holds the other engine's bundle, whose wheels and stubs share /tmp/site; use a fresh machine" >&2
  exit 2
fi
mkdir -p "$out" "$work"
say() { echo "$*" | tee -a "$out/summary.txt"; }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
say "$(date -u +%FT%TZ) $name on ${card:-no GPU}"
