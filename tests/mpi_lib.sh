# What the tests/mpi_*.sh scripts share; sourced by them after `set -euo pipefail`:
#   source "$(dirname "$0")/mpi_lib.sh" DHP_BINARY
# Sets `dhp`, `tests` (this folder) and `work` (a scratch folder, removed on exit unless KEEP
# is set), lets mpirun run as root, and defines the functions below.
dhp=$1
tests=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One machine's transports only (shared memory through ob1, as Open MPI picks on one node
# anyway): probing UCX, OFI and InfiniBand took a quarter of a second of every mpirun.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx

# hf_fixture SCRIPT OUT ARGS...: the folder OUT as tests/reference/SCRIPT makes it with ARGS, the
# script run once per build (tests/reference/cached_fixture.py; the cache lies beside the dhp
# binary, as the gtest executables' does).
hf_fixture() {
  local script=$1 out=$2
  shift 2
  /usr/bin/python3 "$tests/reference/cached_fixture.py" "$(dirname "$dhp")/fixture-cache" "$out" "$script" "$@"
}

# synth_longtail DIR [SCALE]: the long-tail data set of the multi-process tests, scaled down
# (by 0.1 unless SCALE) so that a few of its samples outgrow one rank's share of a batch of 8
# (the planner rings them).
synth_longtail() {
  "$dhp" data synth --out "$1" --preset video-longtail --train 96 --val 8 --seed 5 \
    --scale "${2:-0.1}" --factor 16 >/dev/null
}

# small_run_toml DATA_DIR STEPS [VAL] [DATA_KEYS]: the small model of small_model.toml on
# DATA_DIR's training set, one thread per rank, batches of 8; VAL is the held-out set (none
# by default), DATA_KEYS more [data] lines; the TOML on standard input (more sections) follows.
# data.max_tokens is $max_tokens, 1500 unless set.
small_run_toml() {
  cat "$tests/small_model.toml"
  cat <<TOML
[data]
train = "$1/train.jsonl"
val = "${3:-}"
tokenizer = "$1/tokenizer.model"
workers = 0
max_tokens = ${max_tokens:-1500}
${4:-}
[train]
steps = $2
batch_size = 8
threads = 1
TOML
  cat
}

# train_run LOG [mpirun -np N ...] -- ARGS: runs `dhp train ARGS` (under the launcher words
# before --, if any), its output in LOG, printed when it fails.
train_run() {
  local log=$1 launcher=()
  shift
  while [ "$1" != "--" ]; do launcher+=("$1"); shift; done
  shift
  "${launcher[@]}" "$dhp" train "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
  # mpirun gives its ranks a pty: colour must still stay out of a log that goes to a file.
  if grep -q $'\033' "$log"; then echo "$log: colour escape codes in a log written to a file"; exit 1; fi
}

# quiet_run_toml: the TOML tail of the scripts that compare runs: many small gradient buckets,
# no refit of the cost model (so every run plans alike), no progress bar.
quiet_run_toml() {
  cat <<TOML
[parallel]
bucket_mb = 0.02
refit = false
[log]
progress = false
TOML
}

# export_hf SOURCE OUT: `dhp export --format hf` of SOURCE (a checkpoint folder or an earlier
# export) into OUT, its output in OUT.log, printed when it fails.
export_hf() {
  "$dhp" export --format hf --checkpoint "$1" -o "$2" >"$2.log" 2>&1 || { cat "$2.log"; exit 1; }
}

# export_weights RUN_DIR: RUN_DIR/model.safetensors from the newest checkpoint of RUN_DIR/ckpt.
export_weights() {
  "$dhp" export --checkpoint "$1/ckpt" --out "$1/model.safetensors" >/dev/null 2>&1 \
    || { echo "export of $1 failed" >&2; exit 1; }
}
