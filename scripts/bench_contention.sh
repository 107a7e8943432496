#!/usr/bin/env bash
# Demo training steps on an idle machine and next to one busy process (another program that
# holds a core), with the compute threads following the free cores (train.adapt_threads,
# the default) and without. Prints the median step time of each run and its ratio to the
# idle run. With one of two cores taken, "what the lost core explains" is about the 1-thread
# step time; a team that keeps spinning on both cores is many times slower than that.
#   scripts/bench_contention.sh [steps]      (needs build/dhp and data/demo from scripts/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
dhp=./build/dhp
[ -x "$dhp" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
if [ ! -f data/demo/tokenizer.model ]; then
  "$dhp" data synth --out data/demo --train 8000 --val 300 --force >/dev/null
fi
work=$(mktemp -d)
busy_pid=""
cleanup() { [ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

run() {  # name threads adapt busy
  local name=$1 threads=$2 adapt=$3 busy=$4
  if [ "$busy" = yes ]; then
    timeout 600 sh -c 'while :; do :; done' &
    busy_pid=$!
    sleep 1
  fi
  "$dhp" train --config configs/demo.toml --train.steps="$steps" --train.threads="$threads" \
    --train.adapt_threads="$adapt" --eval.every=0 --data.val= --checkpoint.dir="$work/$name/ck" \
    --log.metrics="$work/$name/metrics.jsonl" --log.progress=false --log.level=warn >/dev/null
  if [ -n "$busy_pid" ]; then kill "$busy_pid" 2>/dev/null; wait "$busy_pid" 2>/dev/null || true; busy_pid=""; fi
  # Median step time after the first 5 steps (arena growth, first decodes).
  /usr/bin/python3 - "$work/$name/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_s"' in l]
s = [r["step_s"] for r in rows[5:]]
t = [r.get("threads", 0) for r in rows[5:]]
print(f"{statistics.median(s):.4f} {statistics.mean(t):.2f}")
PY
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load average), $(nproc) cores"
printf "%-34s %10s %8s %14s\n" "run" "step (s)" "vs idle" "mean threads"
idle=""
for spec in "idle, 2 threads:2:true:no" "idle, 1 thread:1:true:no" \
            "busy, 2 threads, adapting:2:true:yes" "busy, 2 threads, fixed:2:false:yes" \
            "busy, 1 thread:1:false:yes"; do
  IFS=: read -r name threads adapt busy <<<"$spec"
  read -r med thr < <(run "$(echo "$name" | tr -c 'a-z0-9' _)" "$threads" "$adapt" "$busy")
  [ -z "$idle" ] && idle=$med
  printf "%-34s %10.4f %7.2fx %14.2f\n" "$name" "$med" "$(awk -v a="$med" -v b="$idle" 'BEGIN{print a/b}')" "$thr"
done
