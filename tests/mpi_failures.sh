#!/usr/bin/env bash
# A rank that stops answering (SIGSTOP) or dies (SIGKILL) in the middle of training: the other
# ranks must stop within the configured time (parallel.timeout_s), the job must exit non-zero,
# and the output must name the rank. Prints the time from the signal until the other ranks are
# gone. Then SIGKILL to one rank in the middle of a save: the checkpoint before stays loadable.
# Then SIGTERM to every rank mid-run: one checkpoint, loadable, and exit 0.
#   tests/mpi_failures.sh DHP_BINARY
set -euo pipefail
source "$(dirname "$0")/mpi_lib.sh" "$1"
trap 'pkill -KILL -f "$work" 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

synth_longtail "$work/data"
small_run_toml "$work/data" 100000 > "$work/run.toml" <<TOML
[parallel]
timeout_s = 5
[checkpoint]
every = 0
[log]
progress = false
every = 1
TOML

# until_steps DIR LOG: waits until DIR/metrics.jsonl records 3 steps (a run in mid-training);
# a run that gets there in no 120 s (a loaded machine) fails here, with its log, rather than
# being signalled before its ranks exist.
until_steps() {
  for _ in $(seq 1200); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge 3 ] && return
    sleep 0.1
  done
  cat "$2"; echo "$1: no 3 steps within 120 s"; exit 1
}

# rank_pid MPIRUN_PID RANK: the pid of a rank, read from its environment; fails naming what it
# found when no child of mpirun is that rank.
rank_pid() {
  for _ in $(seq 50); do
    for p in $(pgrep -P "$1"); do
      if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
        echo "$p"
        return
      fi
    done
    sleep 0.1
  done
  echo "no process of rank $2 under mpirun $1; its children:" >&2
  ps -o pid,stat,args --ppid "$1" >&2 || true
  exit 1
}

# wait_job MPIRUN_PID: waits (at most 60 s) for a job whose ranks were signalled; its exit
# status in $rc. (In this shell, not a subshell: only the shell that started the job can wait.)
wait_job() {
  set +e
  timeout 60 tail --pid="$1" -f /dev/null
  wait "$1"
  rc=$?
  set -e
}

# Rank 0 stopped too: it holds no special role in a collective, and the others must name it.
for run in STOP:2 STOP:0 KILL:2; do
  sig=${run%:*} v=${run#*:}
  log="$work/$sig$v.log"
  mpirun -np 3 --oversubscribe "$dhp" train --config "$work/run.toml" \
    --checkpoint.dir="$work/$sig$v/ck" --log.metrics="$work/$sig$v/metrics.jsonl" >"$log" 2>&1 &
  job=$!
  # Let a few steps run, so the signal lands in the middle of training.
  until_steps "$work/$sig$v" "$log"
  victim=$(rank_pid "$job" "$v")
  others=""
  for r in 0 1 2; do [ "$r" = "$v" ] || others="$others $(rank_pid "$job" "$r")"; done
  [ -n "$victim" ] || { cat "$log"; echo "rank $v not found"; exit 1; }
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
  echo "SIG$sig to rank $v: the other ranks were gone after $elapsed s; job exit status $rc"
  [ "$rc" -ne 0 ] || { cat "$log"; echo "the job must fail"; exit 1; }
  # timeout_s (5 s) plus the step in flight and the job's tear-down: never a hang.
  awk -v e="$elapsed" 'BEGIN{exit !(e < 45)}' || { cat "$log"; echo "too slow"; exit 1; }
  if [ "$sig" = STOP ]; then
    grep -q "no answer within 5 s" "$log" || { cat "$log"; echo "no timeout message"; exit 1; }
    # The first survivor to give up names the stopped rank, whatever it was waiting for. (It then
    # takes the job down: the launcher wakes the stopped rank to end it, so a later survivor's
    # check may hear it.)
    grep -m1 "no answer within" "$log" | grep -qE "ranks? ([0-9]+, )*$v(, [0-9]+)* did not answer a check" ||
      { cat "$log"; echo "rank $v is not named"; exit 1; }
    grep -m1 "no answer within" "$log"
  else
    grep -qiE "rank 2|signal 9|killed" "$log" || { cat "$log"; echo "the dead rank is not named"; exit 1; }
    grep -m1 -iE "rank 2|signal 9" "$log"
  fi
done

# SIGKILL to rank 1 in the middle of a save, its part of step 2's moments half written (a model
# of 25M parameters, so that a save takes a while): the others stop under checkpoint.timeout_s,
# step 1's checkpoint stays complete and resumes on 2 ranks, and the resumed run's save removes
# what the dead one left.
ck="$work/SAVE/ck"
wide=(--model.dim=512 --model.layers=6 --model.heads=8 --model.kv_heads=8 --model.ffn=2048 --checkpoint.every=1)
mpirun -np 3 --oversubscribe "$dhp" train --config "$work/run.toml" "${wide[@]}" --checkpoint.timeout_s=3 \
  --checkpoint.dir="$ck" --log.metrics= >"$work/SAVE.log" 2>&1 &
job=$!
victim=$(rank_pid "$job" 1)
part="$ck/step-00000002.optim-00001-of-00003.h5.tmp"
for _ in $(seq 12000); do [ -e "$part" ] && break; sleep 0.01; done
[ -e "$part" ] || { cat "$work/SAVE.log"; echo "no save of step 2 in progress within 120 s"; exit 1; }
kill -KILL "$victim"
wait_job "$job"
[ "$rc" -ne 0 ] || { cat "$work/SAVE.log"; echo "SIGKILL mid-save: the job must fail"; exit 1; }
[ -f "$ck/step-00000001.done" ] && [ ! -e "$ck/step-00000002.done" ] ||
  { ls "$ck"; echo "SIGKILL mid-save: step 1 must be the newest complete checkpoint"; exit 1; }
mpirun -np 2 --oversubscribe "$dhp" train --config "$work/run.toml" "${wide[@]}" --resume auto --train.steps=2 \
  --checkpoint.dir="$ck" --log.metrics= >"$work/SAVE-resume.log" 2>&1 ||
  { cat "$work/SAVE-resume.log"; echo "SIGKILL mid-save: resuming on 2 ranks failed"; exit 1; }
grep -q "resumed from $ck/step-00000001.h5 at step 1" "$work/SAVE-resume.log" ||
  { cat "$work/SAVE-resume.log"; echo "SIGKILL mid-save: not resumed from step 1"; exit 1; }
left=$(find "$ck" -name '*.tmp' -o -name 'step-00000002.optim-*-of-00003.h5' | wc -l)
[ "$left" -eq 0 ] && [ -f "$ck/step-00000002.done" ] ||
  { ls "$ck"; echo "SIGKILL mid-save: $left files of the dead save left, or no step 2 saved"; exit 1; }
echo "SIGKILL to rank 1 mid-save (exit status $rc): step 1 complete, resumed on 2 ranks, the dead save's files pruned"

# SIGTERM to every rank, as a launcher sends it: the ranks agree on the step to stop after,
# save one checkpoint together and exit 0; the checkpoint resumes.
mpirun -np 3 --oversubscribe "$dhp" train --config "$work/run.toml" \
  --checkpoint.dir="$work/TERM/ck" --log.metrics="$work/TERM/metrics.jsonl" >"$work/TERM.log" 2>&1 &
job=$!
until_steps "$work/TERM" "$work/TERM.log"
# Every rank found first, then signalled at once, as a launcher does: looked up one by one, the
# last could already have stopped (the others agree on the stop with it) and not be found.
pids=""
for r in 0 1 2; do pids="$pids $(rank_pid "$job" "$r")"; done
# shellcheck disable=SC2086
kill -TERM $pids
wait_job "$job"
[ "$rc" -eq 0 ] || { cat "$work/TERM.log"; echo "SIGTERM: exit status $rc, expected 0"; exit 1; }
# One complete checkpoint (its marker), its weights' file and the part of the moments each of
# the 3 ranks wrote beside it.
n=$(ls "$work/TERM/ck"/*.done | wc -l)
[ "$n" -eq 1 ] || { ls "$work/TERM/ck"; echo "SIGTERM: $n checkpoints, expected 1"; exit 1; }
ck=$(basename "$(ls "$work/TERM/ck"/*.done)" .done)
n=$(ls "$work/TERM/ck/$ck".optim-*-of-00003.h5 | wc -l)
[ "$n" -eq 3 ] && [ -f "$work/TERM/ck/$ck.h5" ] || { ls "$work/TERM/ck"; echo "SIGTERM: $n moment parts, expected 3"; exit 1; }
mpirun -np 2 --oversubscribe "$dhp" train --config "$work/run.toml" --resume auto \
  --checkpoint.dir="$work/TERM/ck" --train.steps="$(( $(wc -l < "$work/TERM/metrics.jsonl") + 1 ))" \
  --log.metrics= >"$work/TERM-resume.log" 2>&1 || { cat "$work/TERM-resume.log"; echo "resume failed"; exit 1; }
echo "SIGTERM to all 3 ranks: exit 0, one checkpoint ($ck.h5 and its 3 moment parts), resumed on 2 ranks"

