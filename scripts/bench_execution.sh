#!/usr/bin/env bash
# The same long-tail batches executed under every strategy, 4 ranks with one compute thread
# each (mpirun on this machine's cores, so busy time is measured as thread CPU time), then
# 2 ranks on 2 cores for wall-clock speed. Prints per strategy: each rank's busy seconds over
# the measured steps, the mean max/mean imbalance, the mean makespan rebuilt from the measured
# group times on the plan's schedule, and the cost model's mean error (refitted online).
#   scripts/bench_execution.sh [steps]     (needs build/dhp; makes data/longtail when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
warm=5  # steps left out of the averages: arenas growing, the refit's first observations
dhp=./build/dhp
[ -x "$dhp" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
# data/longtail/videos: a set made before the preset wrote real clips is made again.
[ -f data/longtail/train.jsonl ] && [ -d data/longtail/videos ] || "$dhp" data synth --force --preset video-longtail --out data/longtail \
  --train 2000 --val 100 --scale 0.25 --factor 16 >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # name ranks extra-args...
  local name=$1 n=$2
  shift 2
  mpirun -np "$n" --oversubscribe "$dhp" train --config configs/longtail.toml \
    --train.steps="$steps" --train.threads=1 --eval.every=0 --data.val= --log.level=warn \
    --checkpoint.dir="$work/$name/ck" --log.metrics="$work/$name/metrics.jsonl" "$@" \
    >"$work/$name.log" 2>&1 || { tail -5 "$work/$name.log"; return 1; }
}

echo "load: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min averages), $(nproc) cores; $steps steps, first $warm left out"
names=()
for spec in "dhp:dhp:0" "pow2:pow2:0" "static-cp1:static:1" "static-cp2:static:2" "static-cp4:static:4"; do
  IFS=: read -r name strategy cp <<<"$spec"
  if run "$name" 4 --parallel.strategy="$strategy" --parallel.static_cp="$cp"; then
    names+=("$name")
  else
    echo "$name: did not run (see above)"
  fi
done
for name in dhp pow2 static-cp1 static-cp2; do
  run "wall-$name" 2 --parallel.strategy="${name%%-*}" \
    --parallel.static_cp="$([ "$name" = static-cp2 ] && echo 2 || echo 1)" || true
done

/usr/bin/python3 - "$work" "$warm" "${names[@]}" <<'PY'
import json, os, statistics, sys
work, warm, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def steps(name):
    p = os.path.join(work, name, "metrics.jsonl")
    if not os.path.exists(p): return []
    return [r for r in map(json.loads, open(p)) if "eval" not in r][warm:]
print(f"\n4 ranks, 1 compute thread each")
print(f"{'strategy':<12} {'busy s per rank':<30} {'imbalance':>9} {'makespan s':>11} {'cost err':>9} {'degrees seen':>14}")
rows = {}
for n in names:
    s = steps(n)
    if not s: continue
    busy = [sum(r["rank_busy_s"][i] for r in s) for i in range(len(s[0]["rank_busy_s"]))]
    imb = statistics.mean(r["imbalance"] for r in s)
    mk = statistics.mean(r["measured_s"] for r in s)
    err = statistics.mean(r["cost_error"] for r in s)
    deg = sorted({d for r in s for d in r["degrees"]})
    rows[n] = mk
    print(f"{n:<12} {' '.join(f'{b:6.2f}' for b in busy):<30} {imb:9.3f} {mk:11.4f} {100*err:8.1f}% {','.join(map(str, deg)):>14}")
static = {n: v for n, v in rows.items() if n.startswith("static")}
if "dhp" in rows and static:
    best = min(static, key=static.get)
    print(f"\ndhp makespan vs best static ({best}): {static[best] / rows['dhp']:.3f}x shorter")
if "dhp" in rows and "pow2" in rows:
    print(f"dhp makespan vs pow2: {rows['pow2'] / rows['dhp']:.3f}x shorter")
print(f"\n2 ranks on 2 cores, wall clock")
for n in ["dhp", "pow2", "static-cp1", "static-cp2"]:
    s = steps("wall-" + n)
    if s:
        print(f"{n:<12} {len(s) / sum(r['step_s'] for r in s):6.2f} steps/s")
PY
