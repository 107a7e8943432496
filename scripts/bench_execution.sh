#!/usr/bin/env bash
# The same long-tail batches executed under every strategy, interleaved: each round runs, at
# every world, dhp, pow2 and the static layouts at every CP degree that divides the world
# (the order rotates from round to round so that a slow spell of the machine does not always
# hit the same strategy), then 2 ranks for wall-clock speed. One compute thread per rank, so a
# group's time is thread CPU time less its waits (mpirun oversubscribes the cores; busy time
# does not count the time a rank is descheduled). Every run starts from the same seed, so every
# strategy trains on the same batches.
#
# Prints per world and strategy the median over the rounds of the mean rebuilt makespan (each
# plan's schedule replayed with its measured group times) with the min-max, and dhp's ratio to
# the best baseline (pow2 or a static layout) of the same round, median and min-max; then the
# 2-rank wall clock (steps/s) the same way. The metrics files stay in OUT for
# scripts/cost_error.py, and OUT/load.txt holds the load average beside each run.
#
#   scripts/bench_execution.sh [rounds] [steps] [worlds] [out]
#     rounds  3 (at least 3 for a spread worth printing)
#     steps   16 per run, the first 4 left out (arenas growing, the refit's first observations)
#     worlds  "2 3 4 6 8"
#     out     runs/bench_execution
#   quick look: scripts/bench_execution.sh 1 8 "3"
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-16}
worlds=${3:-"2 3 4 6 8"}
out=${4:-runs/bench_execution}
warm=$(( steps >= 8 ? 4 : steps / 2 ))
dhp=${DHP:-./build/dhp}  # DHP: another binary, e.g. a copy that a rebuild will not replace mid-run
[ -x "$dhp" ] || { echo "no dhp binary at $dhp: build first (scripts/setup.sh)" >&2; exit 1; }
[[ "$rounds" =~ ^[1-9][0-9]*$ && "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "rounds and steps must be positive integers" >&2; exit 1; }
# data/longtail/videos: a set made before the preset wrote real clips is made again.
[ -f data/longtail/train.jsonl ] && [ -d data/longtail/videos ] || "$dhp" data synth --force --preset video-longtail --out data/longtail \
  --train 2000 --val 100 --scale 0.25 --factor 16 >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$out"
mkdir -p "$out"
ck=$(mktemp -d)
trap 'rm -rf "$ck"' EXIT

run() {  # tag ranks strategy cp
  local tag=$1 n=$2 strategy=$3 cp=$4
  echo "$tag $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.txt"
  mpirun -np "$n" --oversubscribe "$dhp" train --config configs/longtail.toml \
    --train.steps="$steps" --train.threads=1 --eval.every=0 --data.val= --log.level=warn \
    --parallel.strategy="$strategy" --parallel.static_cp="$cp" \
    --checkpoint.dir="$ck/$tag" --checkpoint.every=0 --log.metrics="$out/$tag.jsonl" \
    >"$out/$tag.log" 2>&1 || { echo "$tag: failed"; tail -5 "$out/$tag.log"; }
  rm -rf "${ck:?}/$tag"
}

rotate() {  # shift list...: the list rotated left by shift
  local k=$1
  shift
  local a=("$@") n=$#
  for ((i = 0; i < n; ++i)); do echo "${a[(i + k) % n]}"; done
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min averages), $(nproc) cores; $rounds rounds of $steps steps, the first $warm left out; worlds $worlds"
start=$(date +%s)
for ((r = 1; r <= rounds; ++r)); do
  for w in $worlds; do
    specs=("dhp:dhp:0" "pow2:pow2:0")
    for ((c = 1; c <= w; ++c)); do ((w % c == 0)) && specs+=("static-cp$c:static:$c"); done
    for spec in $(rotate $((r - 1)) "${specs[@]}"); do
      IFS=: read -r name strategy cp <<<"$spec"
      run "w$w-$name-r$r" "$w" "$strategy" "$cp"
    done
  done
  for spec in $(rotate $((r - 1)) dhp:dhp:0 pow2:pow2:0 static-cp1:static:1 static-cp2:static:2); do
    IFS=: read -r name strategy cp <<<"$spec"
    run "wall-$name-r$r" 2 "$strategy" "$cp"
  done
  echo "round $r done after $(( $(date +%s) - start )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$out" "$warm" <<'PY'
import glob, json, os, re, sys
import numpy as np
out, warm = sys.argv[1], int(sys.argv[2])
runs = {}  # (world or "wall", strategy) -> {round: [step records]}
for p in glob.glob(os.path.join(out, "*.jsonl")):
    m = re.match(r"(w(\d+)|wall)-(.+)-r(\d+)\.jsonl$", os.path.basename(p))
    if not m: continue
    world = "wall" if m.group(1) == "wall" else int(m.group(2))
    steps = [r for r in map(json.loads, open(p)) if "eval" not in r][warm:]
    if steps: runs.setdefault((world, m.group(3)), {})[int(m.group(4))] = steps
order = lambda s: (0 if s == "dhp" else 1 if s == "pow2" else 2, int(s[9:]) if s.startswith("static-cp") else 0)
def spread(v): return f"{np.median(v):.4f} ({min(v):.4f}-{max(v):.4f})"
def ratio(v): return f"{np.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
worlds = sorted({w for w, _ in runs if w != "wall"})
print("\nrebuilt makespan per step, s: median over rounds (min-max); dhp / best baseline of the same round")
for w in worlds:
    strat = sorted({s for x, s in runs if x == w}, key=order)
    per = {s: {r: np.mean([x["measured_s"] for x in v]) for r, v in runs[(w, s)].items()} for s in strat}
    err = {s: np.median([g for v in runs[(w, s)].values() for g in (x["cost_error"] for x in v)]) for s in strat}
    print(f"\nworld {w}")
    print(f"  {'strategy':<13} {'makespan s':<26} {'cost err':>8}  degrees")
    for s in strat:
        deg = sorted({d for v in runs[(w, s)].values() for x in v for d in x["degrees"]})
        print(f"  {s:<13} {spread(list(per[s].values())):<26} {100 * err[s]:7.1f}%  {','.join(map(str, deg))}")
    if "dhp" in per:
        base = [s for s in strat if s != "dhp"]
        rs = sorted(set(per["dhp"]).intersection(*[set(per[s]) for s in base]))
        if rs and base:
            best_med = min(base, key=lambda s: np.median(list(per[s].values())))
            paired = [per["dhp"][r] / min(per[s][r] for s in base) for r in rs]
            print(f"  dhp / best baseline of each round: {ratio(paired)}; median dhp / median of the best "
                  f"({best_med}): {np.median(list(per['dhp'].values())) / np.median(list(per[best_med].values())):.3f}")
        cands = {}
        for v in runs[(w, "dhp")].values():
            for x in v:
                k = x.get("rule", "").split(":")[0] or "-"
                cands[k] = cands.get(k, 0) + 1
        print(f"  dhp's choices: " + ", ".join(f"{k} {n}" for k, n in sorted(cands.items())))
wall = sorted({s for x, s in runs if x == "wall"}, key=order)
if wall:
    print("\n2 ranks on the machine's cores, wall clock, steps/s: median over rounds (min-max)")
    per = {s: {r: len(v) / sum(x["step_s"] for x in v) for r, v in runs[("wall", s)].items()} for s in wall}
    for s in wall: print(f"  {s:<13} {spread(list(per[s].values()))}")
    if "dhp" in per:
        base = [s for s in wall if s != "dhp"]
        rs = sorted(set(per["dhp"]).intersection(*[set(per[s]) for s in base]))
        if rs and base:
            paired = [per["dhp"][r] / max(per[s][r] for s in base) for r in rs]
            print(f"  dhp / best baseline of each round (steps/s, higher is better): {ratio(paired)}")
PY
