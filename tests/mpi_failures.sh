#!/usr/bin/env bash
# A rank that stops answering (SIGSTOP) or dies (SIGKILL) in the middle of training: the other
# ranks must stop within the configured time (parallel.timeout_s), the job must exit non-zero,
# and the output must name the rank. Prints the time from the signal until the other ranks are
# gone.
#   tests/mpi_failures.sh DHP_BINARY
set -euo pipefail
dhp=$1
work=$(mktemp -d)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

"$dhp" data synth --out "$work/data" --preset video-longtail --train 96 --val 8 --seed 5 \
  --scale 0.1 --factor 16 >/dev/null
{ cat "$(dirname "$0")/small_model.toml"; cat <<TOML
[data]
train = "$work/data/train.jsonl"
val = ""
tokenizer = "$work/data/tokenizer.model"
workers = 0
max_tokens = 1500
[train]
steps = 100000
batch_size = 8
threads = 1
[parallel]
timeout_s = 5
[checkpoint]
every = 0
[log]
progress = false
every = 1
TOML
} > "$work/run.toml"

# rank_pid MPIRUN_PID RANK: the pid of a rank, read from its environment.
rank_pid() {
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}

for sig in STOP KILL; do
  log="$work/$sig.log"
  mpirun -np 3 --oversubscribe "$dhp" train --config "$work/run.toml" \
    --checkpoint.dir="$work/$sig/ck" --log.metrics="$work/$sig/metrics.jsonl" >"$log" 2>&1 &
  job=$!
  # Let a few steps run, so the signal lands in the middle of training.
  for _ in $(seq 300); do
    [ -f "$work/$sig/metrics.jsonl" ] && [ "$(wc -l < "$work/$sig/metrics.jsonl")" -ge 3 ] && break
    sleep 0.1
  done
  victim=$(rank_pid "$job" 2)
  others="$(rank_pid "$job" 0) $(rank_pid "$job" 1)"
  [ -n "$victim" ] || { cat "$log"; echo "rank 2 not found"; exit 1; }
  t0=$(date +%s.%N)
  kill -"$sig" "$victim"
  # The other ranks must go by themselves; a stopped rank cannot, so it is killed after.
  for _ in $(seq 600); do
    alive=0
    for p in $others; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  t1=$(date +%s.%N)
  kill -KILL "$victim" 2>/dev/null || true
  set +e
  wait "$job"
  rc=$?
  set -e
  elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  echo "SIG$sig to rank 2: the other ranks were gone after $elapsed s; job exit status $rc"
  [ "$rc" -ne 0 ] || { cat "$log"; echo "the job must fail"; exit 1; }
  awk -v e="$elapsed" 'BEGIN{exit !(e < 30)}' || { cat "$log"; echo "too slow"; exit 1; }
  if [ "$sig" = STOP ]; then
    grep -q "no answer within 5 s" "$log" || { cat "$log"; echo "no timeout message"; exit 1; }
    grep -m1 "no answer within" "$log"
  else
    grep -qiE "rank 2|signal 9|killed" "$log" || { cat "$log"; echo "the dead rank is not named"; exit 1; }
    grep -m1 -iE "rank 2|signal 9" "$log"
  fi
done
