#!/usr/bin/env bash
# A run that starts from a Hugging Face checkpoint, end to end: a Qwen2-style fixture (q/k/v
# biases, grouped-query attention, BF16, eps 1e-5) with its own Llama-style tokenizer (unk 0,
# bos 1, eos 2, no pad; LLaVA's <image> and <pad> appended, so the vocabulary grows from the
# file's 300 rows to 320), trained on image data laid out by the llava_v1 template, on one rank
# and on 2 and 3 MPI ranks under every strategy: the same losses and weights to fp32 rounding (plan
# invariance with the new tokenizer, template and biases). Then the run is exported to the
# Hugging Face layout, the export imported and exported again: byte-identical tensors, and
# the tokenizer files carry the added tokens.
#   tests/mpi_hf_llava.sh DHP_BINARY SOURCE_DIR
set -euo pipefail
dhp=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 "$src/tests/reference/make_hf_fixture.py" "$work/hf" --arch qwen2 --hidden 64 \
  --heads 4 --kv 2 --layers 2 --ffn 128 --vocab 300 --eps 1e-5 --dtype bf16 --tokenizer --seed 7
"$dhp" data synth --out "$work/data" --preset mixed --train 96 --val 8 --seed 5 \
  --scale 0.1 --factor 16 >/dev/null
{ cat "$(dirname "$0")/small_model.toml"; cat <<TOML
[data]
train = "$work/data/train.jsonl"
val = ""
tokenizer = "$work/hf"
template = "llava_v1"
workers = 0
max_tokens = 1500
[train]
steps = 6
batch_size = 8
threads = 1
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
"$dhp" train --config "$work/run.toml" --model.init="$work/hf" --log.metrics="$work/one/metrics.jsonl" \
  --checkpoint.dir="$work/one/ckpt" >"$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
grep -q "imported .* decoder tensors (BF16)" "$work/one.log" \
  || { echo "the decoder was not imported"; cat "$work/one.log"; exit 1; }
grep -Eq "model.vocab_size += 320" "$work/one.log" \
  || { echo "the vocabulary did not grow to the tokenizer's 302 tokens rounded up"; grep vocab "$work/one.log"; exit 1; }
grep -Eq "model.attention_bias += true" "$work/one.log" || { echo "no q/k/v biases"; exit 1; }
export_weights "$work/one"
runs=()
for spec in dhp:3 pow2:3 static:3 static-3:3 dhp:2; do
  IFS=: read -r name n <<<"$spec"
  strategy=${name%%-*}
  extra=()
  [ "$name" = static-3 ] && extra=(--parallel.static_cp=3)  # every group a ring of 3
  r="$work/$name-$n"
  mpirun -np "$n" --oversubscribe "$dhp" train --config "$work/run.toml" --model.init="$work/hf" \
    --parallel.strategy="$strategy" "${extra[@]}" --log.metrics="$r/metrics.jsonl" \
    --checkpoint.dir="$r/ckpt" >"$r.log" 2>&1 || { cat "$r.log"; exit 1; }
  export_weights "$r"
  runs+=("$name:$n:$r")
done

/usr/bin/python3 - "$work/one" "${runs[@]}" <<'PY'
import json, struct, sys
import numpy as np
def steps(d):
    return [r for r in map(json.loads, open(d + "/metrics.jsonl")) if "eval" not in r]
def weights(d):
    with open(d + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]], dtype=np.float32)
            for k, t in header.items() if k != "__metadata__"}
one, w_one = steps(sys.argv[1]), weights(sys.argv[1])
assert len(one) == 6, len(one)
assert "layers.0.attn.wq.bias" in w_one and w_one["tok_embed.weight"].size == 320 * 64
rings = 0
for spec in sys.argv[2:]:
    strategy, n, d = spec.split(":", 2)
    other = steps(d)
    assert len(other) == 6, (spec, len(other))
    for i, (a, b) in enumerate(zip(one, other), 1):
        x, y = a["loss"], b["loss"]
        tol = 1e-5 if i == 1 else 1e-4  # sums in another order; Adam amplifies slightly later
        assert abs(x - y) <= tol * abs(x), f"{strategy}, step {i}: 1 rank {x}, {n} ranks {y}"
    w = weights(d)
    assert w.keys() == w_one.keys(), spec
    for name, ref in w_one.items():
        err = float(np.max(np.abs(w[name] - ref)))
        scale = float(np.max(np.abs(ref))) or 1.0
        assert err <= 1e-4 * scale, f"{strategy} on {n} ranks: {name} differs by {err} (scale {scale})"
    widest = max(r["max_degree"] for r in other)
    rings += widest > 1
    print(f"{strategy} on {n} ranks: losses {', '.join('%.5f' % r['loss'] for r in other)}; "
          f"widest ring {widest}")
assert rings >= 2, "no strategy put a sample on a ring: the data does not exercise ring attention"
PY

# Export to the Hugging Face layout, then import that export and export it again.
"$dhp" export --format hf --checkpoint "$work/one/ckpt" -o "$work/e1" >"$work/e1.log" 2>&1 \
  || { cat "$work/e1.log"; exit 1; }
"$dhp" export --format hf --checkpoint "$work/e1" -o "$work/e2" >"$work/e2.log" 2>&1 \
  || { cat "$work/e2.log"; exit 1; }
/usr/bin/python3 - "$work/e1" "$work/e2" "$work/hf" <<'PY'
import json, struct, sys
def tensors(d):
    with open(d + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in header.items() if k != "__metadata__"}
e1, e2, src = tensors(sys.argv[1]), tensors(sys.argv[2]), tensors(sys.argv[3])
assert e1.keys() == e2.keys() == src.keys(), (sorted(e1.keys() ^ src.keys()))
for k in e1:
    assert e1[k] == e2[k], f"{k}: the re-import's export differs"
    assert e1[k][0] == "BF16", f"{k}: exported as {e1[k][0]}, the run started from BF16"
assert e1["model.embed_tokens.weight"][1] == [320, 64]
trained = sum(e1[k][2] != src[k][2] for k in e1)
assert trained == len(e1), f"only {trained} of {len(e1)} tensors changed in training"
added = json.load(open(sys.argv[1] + "/added_tokens.json"))
assert added == {"<image>": 300, "<pad>": 301}, added
cfg = json.load(open(sys.argv[1] + "/config.json"))
assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["vocab_size"] == 320, cfg
assert cfg["rms_norm_eps"] == 1e-5, cfg["rms_norm_eps"]
print(f"export -> import -> export: {len(e1)} tensors byte-identical (BF16); added tokens {added}")
PY
echo "a Hugging Face start trains with llava_v1 on 1 and 3 ranks alike, and exports round-trip"
