#!/usr/bin/env bash
# One device call: tools/bench_gpu.py on a baseline tree and on the working tree, on one machine,
# alternately (A B, then B A, ...), so that a change is read against its baseline in the same run
# (these machines differ by several percent from one to the next). Ends with tools/bench_compare.py's table.
#
# Here first:  python tools/prepare_device.py --baseline REV     (.whl, .carry/base, the tokenizer)
# Then (device tool, carry .whl and .carry; a random checkpoint and two core exports come before the
# first figure, so keep rounds x suite well inside the call's 10 minutes):
#   bash tools/gpu_ab.sh [--rounds 2] [--shape llama3-8b] [--keys bs1_,bs64_,suite_a.]
#                        [--bench-args "--skip-hf --skip-structured --suite a,c --max-active 256 --chunk 2048"]
# Both trees export their own core (the format may differ between them) from one random checkpoint.
# Back under $OUT: A<r>.json and B<r>.json (bench_gpu.json of each run), ab.log, smi.csv (power and clocks).
set -uo pipefail
ROUNDS=1; SHAPE=llama3-8b; KEYS=""; EXTRA="--skip-hf --skip-structured --skip-serving"
while [ $# -gt 0 ]; do case "$1" in
  --rounds) ROUNDS=$2; shift 2;; --shape) SHAPE=$2; shift 2;; --keys) KEYS=$2; shift 2;;
  --bench-args) EXTRA=$2; shift 2;; *) echo "unknown $1"; exit 2;; esac; done
[ "$ROUNDS" -le 2 ] || { echo "at most 2 rounds: four JSON files, the log and smi.csv fill what \$OUT returns"; exit 2; }
[ -f .carry/base/REVISION ] || { echo ".carry/base is missing: run python tools/prepare_device.py --baseline REV here"; exit 2; }
[ -f .carry/llama3-tokenizer.json ] || { echo ".carry/llama3-tokenizer.json is missing: tools/prepare_device.py"; exit 2; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG="$OUT/ab.log"
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/device_setup.sh"
install_wheels .whl/*.whl || exit 1
NEW=$PWD; BASE=$PWD/.carry/base; TOKENIZER=$PWD/.carry/llama3-tokenizer.json
echo "A = $(cat "$BASE/REVISION") (.carry/base), B = the working tree" | tee "$LOG"
for tree in "$BASE" "$NEW"; do
  t0=$(date +%s)
  build_tree "$tree" >> "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
  echo "built $tree in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
done
# One random checkpoint for both: each tree's workdir links to it, and the first run writes it.
rm -rf /tmp/flare-ab/out-*  # a failed run must not leave an earlier call's figures to be copied
mkdir -p "/tmp/flare-ab/hf/$SHAPE-hf" /tmp/flare-ab/A /tmp/flare-ab/B
ln -sfn "/tmp/flare-ab/hf/$SHAPE-hf" "/tmp/flare-ab/A/$SHAPE-hf"
ln -sfn "/tmp/flare-ab/hf/$SHAPE-hf" "/tmp/flare-ab/B/$SHAPE-hf"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,utilization.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 1000 > "$OUT/smi.csv" 2>/dev/null &
SMI=$!
run() {  # run LABEL TREE ROUND
  local label=$1 tree=$2 round=$3
  echo "=== $label$round start $(date -u +%H:%M:%S)" | tee -a "$LOG"
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  (cd "$tree" && PYTHONPATH="$tree:/tmp/site" python3 tools/bench_gpu.py --shape "$SHAPE" --tokenizer "$TOKENIZER" \
     --workdir "/tmp/flare-ab/$label" --out "/tmp/flare-ab/out-$label$round" $EXTRA) 2>&1 \
    | grep -v "verifying" >> "$LOG"
  echo "=== $label$round end $(date -u +%H:%M:%S) rc=${PIPESTATUS[0]}" | tee -a "$LOG"
  cp "/tmp/flare-ab/out-$label$round/bench_gpu.json" "$OUT/$label$round.json" 2>/dev/null
}
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then run A "$BASE" "$round"; run B "$NEW" "$round"
  else run B "$NEW" "$round"; run A "$BASE" "$round"; fi
done
kill "$SMI" 2>/dev/null
python3 tools/bench_compare.py --base $(seq -f "$OUT/A%g.json" 1 "$ROUNDS") --new $(seq -f "$OUT/B%g.json" 1 "$ROUNDS") \
  --base-label "A $(cut -c1-10 "$BASE/REVISION")" --new-label "B (working tree)" --keys "$KEYS" | tee -a "$LOG"
