#!/usr/bin/env bash
# Frozen groups across real processes: the vision tower and the embeddings frozen (so the
# trainable ranges are two pieces: the projector, then the decoder layers), the projector at
# half the learning rate. One rank against 3 MPI ranks with ZeRO-1 and gradient buckets
# reduced while backward runs, 2 ranks replicated, and 3 ranks summing after backward: the
# same losses and weights to fp32 rounding; every frozen tensor bit for bit the initial one
# (a 0-step run's export); and the logs report only the trainable parameters' state.
#   tests/mpi_frozen_match.sh DHP_BINARY
set -euo pipefail
dhp=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$dhp" data synth --out "$work/data" --preset video-longtail --train 64 --val 8 --seed 5 \
  --scale 0.1 --factor 16 >/dev/null
{ cat "$(dirname "$0")/small_model.toml"; cat <<TOML
[data]
train = "$work/data/train.jsonl"
val = ""
tokenizer = "$work/data/tokenizer.model"
workers = 0
max_tokens = 1500
[train]
steps = 6
batch_size = 8
threads = 1
[optim.groups.vision]
trainable = false
[optim.groups.embeddings]
trainable = false
[optim.groups.projector]
lr_scale = 0.5
[parallel]
bucket_mb = 0.02
refit = false
[log]
progress = false
TOML
} > "$work/run.toml"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export_weights() {  # run-dir
  "$dhp" export --checkpoint "$1/ckpt" --out "$1/model.safetensors" >/dev/null 2>&1 \
    || { echo "export of $1 failed" >&2; exit 1; }
}
"$dhp" train --config "$work/run.toml" --train.steps=0 --log.metrics="$work/init/metrics.jsonl" \
  --checkpoint.dir="$work/init/ckpt" >"$work/init.log" 2>&1 || { cat "$work/init.log"; exit 1; }
export_weights "$work/init"
"$dhp" train --config "$work/run.toml" --log.metrics="$work/one/metrics.jsonl" \
  --checkpoint.dir="$work/one/ckpt" >"$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
grep -q "frozen: embeddings .*, vision" "$work/one.log" || { echo "no frozen groups logged"; cat "$work/one.log"; exit 1; }
export_weights "$work/one"
runs=()
for spec in zero1:3 replicated:2 after:3; do
  IFS=: read -r name n <<<"$spec"
  extra=()
  case $name in
    replicated) extra=(--parallel.zero1=false) ;;
    after) extra=(--parallel.overlap_grads=false) ;;
  esac
  r="$work/$name-$n"
  mpirun -np "$n" --oversubscribe "$dhp" train --config "$work/run.toml" "${extra[@]}" \
    --log.metrics="$r/metrics.jsonl" --checkpoint.dir="$r/ckpt" >"$r.log" 2>&1 || { cat "$r.log"; exit 1; }
  case $name in
    after) grep -q "summed after backward" "$r.log" ;;
    *) grep -q "summed in [0-9]* buckets" "$r.log" ;;
  esac || { echo "$name: unexpected gradient reduction"; grep "gradients:" "$r.log"; exit 1; }
  export_weights "$r"
  runs+=("$name:$n:$r")
done

/usr/bin/python3 - "$work/init" "$work/one" "${runs[@]}" <<'PY'
import json, struct, sys
import numpy as np
def steps(d):
    return [r for r in map(json.loads, open(d + "/metrics.jsonl")) if "eval" not in r]
def weights(d):
    with open(d + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {name: np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]], dtype=np.float32)
            for name, t in header.items() if name != "__metadata__"}
def frozen(name):
    return name.startswith(("vision.", "tok_embed.", "lm_head."))
init, one_dir = weights(sys.argv[1]), sys.argv[2]
one, w_one = steps(one_dir), weights(one_dir)
assert len(one) == 6, len(one)
assert any(frozen(k) for k in init) and any(not frozen(k) for k in init)
for name, ref in w_one.items():
    moved = not np.array_equal(ref, init[name])
    assert moved != frozen(name), f"1 rank: {name} {'moved' if moved else 'did not train'}"
for spec in sys.argv[3:]:
    label, n, d = spec.split(":", 2)
    other = steps(d)
    assert len(other) == 6, (spec, len(other))
    for i, (a, b) in enumerate(zip(one, other), 1):
        x, y = a["loss"], b["loss"]
        tol = 1e-5 if i == 1 else 1e-4  # as tests/mpi_ranks_match.sh
        assert abs(x - y) <= tol * abs(x), f"{label}, step {i}: 1 rank {x}, {n} ranks {y}"
    w = weights(d)
    assert w.keys() == w_one.keys(), spec
    for name, ref in w_one.items():
        if frozen(name):
            assert np.array_equal(w[name], init[name]), f"{label} on {n} ranks: frozen {name} moved"
            continue
        err = float(np.max(np.abs(w[name] - ref)))
        scale = float(np.max(np.abs(ref))) or 1.0
        assert err <= 1e-4 * scale, f"{label} on {n} ranks: {name} differs by {err} (scale {scale})"
    print(f"{label} on {n} ranks: losses " + ", ".join("%.5f" % r["loss"] for r in other))
PY
echo "frozen groups: 1, 2 and 3 ranks agree; frozen tensors untouched"
