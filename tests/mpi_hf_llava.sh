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
source "$(dirname "$0")/mpi_lib.sh" "$1"
src=$2

hf_fixture make_hf_fixture.py "$work/hf" --arch qwen2 --hidden 64 \
  --heads 4 --kv 2 --layers 2 --ffn 128 --vocab 300 --eps 1e-5 --dtype bf16 --tokenizer --seed 7
"$dhp" data synth --out "$work/data" --preset mixed --train 96 --val 8 --seed 5 \
  --scale 0.1 --factor 16 >/dev/null
quiet_run_toml | small_run_toml "$work/data" 6 "" 'template = "llava_v1"' > "$work/run.toml"
# The checkpoint's own tokenizer, not the synthetic set's.
start=(--config "$work/run.toml" --model.init="$work/hf" --data.tokenizer="$work/hf")
train_run "$work/one.log" -- "${start[@]}" --log.metrics="$work/one/metrics.jsonl" \
  --checkpoint.dir="$work/one/ckpt"
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
  train_run "$r.log" mpirun -np "$n" --oversubscribe -- "${start[@]}" \
    --parallel.strategy="$strategy" "${extra[@]}" --log.metrics="$r/metrics.jsonl" \
    --checkpoint.dir="$r/ckpt"
  export_weights "$r"
  runs+=("$name:$n:$r")
done

/usr/bin/python3 - "$tests/reference" "$work/one" "${runs[@]}" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import compare_runs, weights
w_one = weights(sys.argv[2])
assert "layers.0.attn.wq.bias" in w_one and w_one["tok_embed.weight"].size == 320 * 64
rings = compare_runs(sys.argv[2], sys.argv[3:], 6)
assert rings >= 2, "no strategy put a sample on a ring: the data does not exercise ring attention"
PY

# Export to the Hugging Face layout, then import that export and export it again.
export_hf "$work/one/ckpt" "$work/e1"
export_hf "$work/e1" "$work/e2"
/usr/bin/python3 - "$tests/reference" "$work/e1" "$work/e2" "$work/hf" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import safetensors
e1, e2, src = (safetensors(d + "/model.safetensors") for d in sys.argv[2:5])
assert e1.keys() == e2.keys() == src.keys(), sorted(e1.keys() ^ src.keys())
for k in e1:
    assert e1[k] == e2[k], f"{k}: the re-import's export differs"
    assert e1[k][0] == "BF16", f"{k}: exported as {e1[k][0]}, the run started from BF16"
assert e1["model.embed_tokens.weight"][1] == [320, 64]
trained = sum(e1[k][2] != src[k][2] for k in e1)
assert trained == len(e1), f"only {trained} of {len(e1)} tensors changed in training"
added = json.load(open(sys.argv[2] + "/added_tokens.json"))
assert added == {"<image>": 300, "<pad>": 301}, added
cfg = json.load(open(sys.argv[2] + "/config.json"))
assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["vocab_size"] == 320, cfg
assert cfg["rms_norm_eps"] == 1e-5, cfg["rms_norm_eps"]
print(f"export -> import -> export: {len(e1)} tensors byte-identical (BF16); added tokens {added}")
PY
echo "a Hugging Face start trains with llava_v1 on 1 and 3 ranks alike, and exports round-trip"
