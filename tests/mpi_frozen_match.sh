#!/usr/bin/env bash
# Frozen groups across real processes: the vision tower and the embeddings frozen (so the
# trainable ranges are two pieces: the projector, then the decoder layers), the projector at
# half the learning rate. One rank against 3 MPI ranks with ZeRO-1 and gradient buckets
# reduced while backward runs, 2 ranks replicated, and 3 ranks summing after backward: the
# same losses and weights to fp32 rounding; every frozen tensor bit for bit the initial one
# (a 0-step run's export); and the logs report only the trainable parameters' state.
#   tests/mpi_frozen_match.sh DHP_BINARY
set -euo pipefail
source "$(dirname "$0")/mpi_lib.sh" "$1"

synth_longtail "$work/data"
{
  cat <<TOML
[optim.groups.vision]
trainable = false
[optim.groups.embeddings]
trainable = false
[optim.groups.projector]
lr_scale = 0.5
TOML
  quiet_run_toml
} | small_run_toml "$work/data" 6 > "$work/run.toml"
train_run "$work/init.log" -- --config "$work/run.toml" --train.steps=0 \
  --log.metrics="$work/init/metrics.jsonl" --checkpoint.dir="$work/init/ckpt"
export_weights "$work/init"
train_run "$work/one.log" -- --config "$work/run.toml" --log.metrics="$work/one/metrics.jsonl" \
  --checkpoint.dir="$work/one/ckpt"
grep -q "frozen: embeddings .*, vision" "$work/one.log" || { echo "no frozen groups logged"; cat "$work/one.log"; exit 1; }
export_weights "$work/one"
runs=()
for spec in zero1:3 replicated:2 after:3; do
  IFS=: read -r name n <<<"$spec"
  extra=()
  case $name in
    replicated) extra=(--parallel.zero=0) ;;
    after) extra=(--parallel.overlap_grads=false) ;;
  esac
  r="$work/$name-$n"
  train_run "$r.log" mpirun -np "$n" --oversubscribe -- --config "$work/run.toml" "${extra[@]}" \
    --log.metrics="$r/metrics.jsonl" --checkpoint.dir="$r/ckpt"
  case $name in
    after) grep -q "summed after backward" "$r.log" ;;
    *) grep -q "summed in [0-9]* buckets" "$r.log" ;;
  esac || { echo "$name: unexpected gradient reduction"; grep "gradients:" "$r.log"; exit 1; }
  export_weights "$r"
  runs+=("$name:$n:$r")
done

/usr/bin/python3 - "$tests/reference" "$work/init" "$work/one" "${runs[@]}" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from mpi_runs import same_losses, same_weights, steps, weights
def frozen(name):
    return name.startswith(("vision.", "tok_embed.", "lm_head."))
init, one_dir = weights(sys.argv[2]), sys.argv[3]
one, w_one = steps(one_dir), weights(one_dir)
assert any(frozen(k) for k in init) and any(not frozen(k) for k in init)
for name, ref in w_one.items():
    moved = not np.array_equal(ref, init[name])
    assert moved != frozen(name), f"1 rank: {name} {'moved' if moved else 'did not train'}"
for spec in sys.argv[4:]:
    label, n, d = spec.split(":", 2)
    same_losses(one, steps(d), f"{label} on {n} ranks", 6)
    w = weights(d)
    for name in filter(frozen, w_one):
        assert np.array_equal(w[name], init[name]), f"{label} on {n} ranks: frozen {name} moved"
    same_weights(w_one, w, f"{label} on {n} ranks", skip=frozen)
    print(f"{label} on {n} ranks: losses " + ", ".join("%.5f" % r["loss"] for r in steps(d)))
PY
echo "frozen groups: 1, 2 and 3 ranks agree; frozen tensors untouched"
