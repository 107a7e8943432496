#!/usr/bin/env bash
# Every command of docs/llava.md, in its order, on tiny fixtures on the CPU: LLaVA-1.5's stage 1
# (configs/llava15_pretrain.toml) and stage 2 (configs/llava15_finetune.toml) as the configs
# are, with command-line overrides that only point at the fixtures and shrink the run (steps,
# batch, warm-up, fp32 on the CPU, the fixtures' model shape), then eval, generate, export in
# llava-hf's layout, eval of the export, and the two ways to start from a released LLaVA.
#
#   scripts/llava15_check.sh [DHP_BINARY]      (default: build/dhp; KEEP=1 keeps the work folder)
#
# The work folder has the layout the configs' placeholder paths name (checkpoints/, data/llava/,
# runs/), so the commands run from there as the page writes them. The fixtures stand in for the
# downloads: a Llama decoder with a SentencePiece tokenizer of 300 pieces and 300 rows (Vicuna:
# 32000 and 32000), a CLIPVisionModel (patch 4, 16 px, 3 layers: 16 tokens an image, against
# 576), a llava-hf LlavaForConditionalGeneration and an original LlavaLlamaForCausalLM without
# its tower (tests/reference/make_hf_fixture.py, make_hf_llava_fixture.py); the data are JSON
# arrays in the form of LLaVA's blip_laion_cc_sbu_558k.json and llava_v1_5_mix665k.json with PNG
# and JPEG images. Exits non-zero at the first failure, printing that command's log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dhp=$(realpath "${1:-$root/build/dhp}")
py=/usr/bin/python3
work=$(mktemp -d /tmp/llava15_check.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "work folder kept: $work" || rm -rf "$work"' EXIT
start=$SECONDS
mkdir -p "$work/logs"
cd "$work"

# run NAME CMD...: runs CMD with its output in logs/NAME.log, says how long it took, and on
# failure prints the log's end and stops the script.
run() {
  local name=$1 t0=$SECONDS
  shift
  if ! "$@" >"logs/$name.log" 2>&1; then
    echo "FAILED: $name: $*"
    tail -n 40 "logs/$name.log"
    exit 1
  fi
  printf '  ok  %-28s %3ds\n' "$name" $((SECONDS - t0))
}
# refused NAME PATTERN CMD...: CMD must fail, its output (logs/NAME.log) holding PATTERN.
refused() {
  local name=$1 pattern=$2
  shift 2
  if "$@" >"logs/$name.log" 2>&1; then echo "FAILED: $name: succeeded: $*"; exit 1; fi
  grep -Eq -- "$pattern" "logs/$name.log" || { echo "FAILED: $name: no /$pattern/"; tail -n 20 "logs/$name.log"; exit 1; }
  printf '  ok  %-28s (refused, as it should be)\n' "$name"
}
# expect NAME PATTERN: logs/NAME.log must hold PATTERN (an extended regular expression).
expect() {
  grep -Eq -- "$2" "logs/$1.log" || { echo "FAILED: logs/$1.log lacks /$2/"; tail -n 40 "logs/$1.log"; exit 1; }
}

echo "fixtures in $work"
# --- the downloads -----------------------------------------------------------------------------
# Vicuna's shape keys besides the sizes: rope_theta 10000, rms_norm_eps 1e-5, 4096 positions.
decoder=(--hidden 64 --heads 4 --kv 4 --layers 2 --ffn 128 --tokenizer --seed 7 --theta 10000 --eps 1e-5)
run fixture-vicuna $py "$root/tests/reference/make_hf_fixture.py" checkpoints/vicuna-7b-v1.5 \
  "${decoder[@]}" --vocab 300 --max-pos 4096
# Vicuna-7b-v1.5's tokenizer_config.json names the slow LlamaTokenizer and legacy false.
echo '{"tokenizer_class": "LlamaTokenizer", "legacy": false, "add_bos_token": true}' \
  > checkpoints/vicuna-7b-v1.5/tokenizer_config.json
run fixture-clip $py "$root/tests/reference/make_hf_llava_fixture.py" \
  checkpoints/clip-vit-large-patch14-336 clip_vision --seed 8
run fixture-llava-hf $py "$root/tests/reference/make_hf_llava_fixture.py" \
  checkpoints/llava-1.5-7b-hf llava_hf --tower clip "${decoder[@]}" --vocab 320 --image-token 300
run fixture-llava-orig $py "$root/tests/reference/make_hf_llava_fixture.py" \
  checkpoints/llava-v1.5-7b llava_orig --no-tower "${decoder[@]}" --vocab 300

# --- the data: LLaVA's JSON arrays and image folders -------------------------------------------
run fixture-data $py - <<'PY'
import json, os, random
from PIL import Image, ImageDraw
rng = random.Random(5)
words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "red", "blue", "tree", "sky", "two", "birds"]
colours = {"red": (220, 30, 30), "blue": (30, 60, 220)}

def image(path, colour, fmt):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w, h = rng.randrange(12, 48), rng.randrange(12, 48)
    im = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
    ImageDraw.Draw(im).ellipse([w // 4, h // 4, 3 * w // 4, 3 * h // 4], fill=colours[colour])
    im.save(path, fmt)

def text(lo=4, hi=9):
    return " ".join(rng.choice(words) for _ in range(rng.randrange(lo, hi)))

# Stage 1: blip_laion_cc_sbu_558k.json's form (one pretty-printed array; images/NNNNN/ID.ext).
pre = "data/llava/LLaVA-Pretrain"
recs = []
for i in range(24):
    colour, rel = rng.choice(list(colours)), f"{i // 10:05d}/{i:09d}.{'jpg' if i % 2 else 'png'}"
    image(f"{pre}/images/{rel}", colour, "JPEG" if i % 2 else "PNG")
    q = rng.choice(["Describe the image concisely.", "Give a brief description of the image.",
                    "Render a clear and concise summary of the photo."])
    recs.append({"id": f"{i:09d}", "image": rel, "conversations": [
        {"from": "human", "value": f"{q}\n<image>" if i % 3 else f"<image>\n{q}"},
        {"from": "gpt", "value": f"the {colour} cat {text()}"}]})
with open(f"{pre}/blip_laion_cc_sbu_558k.json", "w") as f:
    json.dump(recs, f, indent=2)

# Stage 2: llava_v1_5_mix665k.json's form (one array on one line): the five image folders,
# multi-turn conversations, <image> first or last in the turn, text-only records (no "image"
# key), and one ocr_vqa image that is a GIF under a .jpg name (skipped: 1 record of 22).
folders = ["coco/train2017", "gqa/images", "ocr_vqa/images", "textvqa/train_images", "vg/VG_100K"]

def mix(n, first, gif=None):
    out = []
    for i in range(first, first + n):
        if i % 7 == 6:
            out.append({"id": f"sharegpt_{i}", "model": "", "conversations": [
                {"from": "human", "value": f"what is a {text()}?"}, {"from": "gpt", "value": text()},
                {"from": "human", "value": text() + "?"}, {"from": "gpt", "value": text(8, 16)}]})
            continue
        colour, rel = rng.choice(list(colours)), f"{folders[i % 5]}/{i:012d}.jpg"
        image(f"data/llava/{rel}", colour, "GIF" if i == gif else "JPEG")
        conv = [{"from": "human", "value": "What is on the mat?\n<image>" if i % 2 else "<image>\nWhat colour is the cat?"},
                {"from": "gpt", "value": f"the {colour} cat"}]
        for _ in range(i % 3):
            conv += [{"from": "human", "value": text() + "?"}, {"from": "gpt", "value": text()}]
        out.append({"id": f"{i:012d}", "image": rel, "conversations": conv})
    return out

with open("data/llava/llava_v1_5_mix665k.json", "w") as f:
    json.dump(mix(22, 0, gif=2), f)
with open("data/llava/llava_val.json", "w") as f:  # held out (LLaVA holds nothing out)
    json.dump(mix(6, 100), f)
PY

# The shrinking overrides: the run's size, and the fixtures' shape where a config writes one out.
tiny=(--train.device=cpu --train.precision=fp32 --train.batch_size=8 --data.workers=1)
tower=(--model.vision.patch=4 --model.vision.image_size=16)
shape=(--model.dim=64 --model.layers=2 --model.heads=4 --model.kv_heads=4 --model.ffn=128
       --model.vocab_size=300 "${tower[@]}" --model.vision.dim=32 --model.vision.layers=3
       --model.vision.heads=4 --model.vision.ffn=64)
# The two stages run as the page's mpirun lines do, on 2 ranks (one process without MPI).
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx
  launch=(mpirun -np 2 --oversubscribe --map-by ppr:2:node --bind-to none)
else
  launch=()
  echo "(no mpirun: the two stages run as one process)"
fi
pre=$root/configs/llava15_pretrain.toml
fine=$root/configs/llava15_finetune.toml

echo "data"
run stats-pretrain "$dhp" data stats --data data/llava/LLaVA-Pretrain/blip_laion_cc_sbu_558k.json \
  --config "$pre" "${tower[@]}"
run stats-mix665k "$dhp" data stats --data data/llava/llava_v1_5_mix665k.json --config "$fine" "${shape[@]}"
expect stats-mix665k "unreadable image"
run build-pretrain "$dhp" data build --config "$pre" --out data/llava/LLaVA-Pretrain/built --workers 2 "${tower[@]}"
run build-mix665k "$dhp" data build --config "$fine" --out data/llava/mix665k_built --workers 2 "${shape[@]}"
expect build-mix665k "21 samples from 22 lines .* 1 skipped: unreadable image: 1"

echo "stage 1 (configs/llava15_pretrain.toml)"
run stage1 "${launch[@]}" "$dhp" train --config "$pre" --data.train=data/llava/LLaVA-Pretrain/built \
  "${tiny[@]}" --train.steps=20 --optim.warmup=2
expect stage1 "kept their seeded initialisation \(4 tensors not in the checkpoint\): projector"
expect stage1 "frozen: language .*, embeddings .*, vision "
s1=runs/llava15_pretrain/checkpoints/step-00000020.h5
[ -f "$s1" ] || { echo "FAILED: stage 1 left no $s1"; exit 1; }

echo "stage 2 (configs/llava15_finetune.toml, --init of stage 1's checkpoint)"
# data.max_skipped: a wrong image folder loses every image record, and the run stops before its
# first step, naming the share and the reason.
refused wrong-image-root "more than data.max_skipped = 5.0%.*missing image" \
  "$dhp" train --config "$fine" --init "$s1" "${shape[@]}" "${tiny[@]}" --train.steps=1 \
  --data.image_root=data/llava/coco --checkpoint.dir=runs/wrong_root/checkpoints --log.metrics= --log.tensorboard=
run stage2 "${launch[@]}" "$dhp" train --config "$fine" --init "$s1" "${shape[@]}" "${tiny[@]}" \
  --train.steps=12 --optim.warmup=2
expect stage2 "initialised weights from $s1"
expect stage2 "frozen: vision "
expect stage2 "model.vision.resize = pad_square"
expect stage2 "1 skipped|unreadable image"
run eval "$dhp" eval --checkpoint runs/llava15_finetune/checkpoints --data data/llava/llava_val.json \
  --json runs/llava15_finetune/eval.json
run generate "$dhp" generate --checkpoint runs/llava15_finetune/checkpoints \
  --image data/llava/coco/train2017/000000000000.jpg --prompt "What colour is the cat?" --max-tokens 8
run export "$dhp" export --format hf --checkpoint runs/llava15_finetune/checkpoints \
  -o runs/llava15_finetune/llava-hf --dtype bf16
expect export "<image> = 300 and <pad> = 301 added after its 300 ids, and the vocabulary grown from 300 to 320 rows"
run eval-export "$dhp" eval --checkpoint runs/llava15_finetune/llava-hf --data data/llava/llava_val.json \
  --data.template=vicuna_v1 --json runs/llava15_finetune/eval_export.json

echo "starting from a released LLaVA"
# llava-hf: its preprocessor_config.json (CLIPImageProcessor) would crop; the config's
# resize = "pad_square" (finetune.sh's image_aspect_ratio pad) wins.
run release-llava-hf "$dhp" train --config "$fine" --model.init=checkpoints/llava-1.5-7b-hf \
  --data.tokenizer=checkpoints/llava-1.5-7b-hf --checkpoint.dir=runs/llava15_finetune_hf/checkpoints \
  --log.metrics=runs/llava15_finetune_hf/metrics.jsonl --log.tensorboard=runs/llava15_finetune_hf/tb \
  "${tiny[@]}" --train.steps=2 --optim.warmup=1
expect release-llava-hf "imported [0-9]+ tensors of the decoder, vision tower and projector .*llava-hf layout"
expect release-llava-hf "model.vision.resize = pad_square, as the configuration says"
run release-original "$dhp" train --config "$fine" --model.init=checkpoints/llava-v1.5-7b \
  --model.vision.init=checkpoints/clip-vit-large-patch14-336 --data.tokenizer=checkpoints/llava-v1.5-7b \
  --checkpoint.dir=runs/llava15_finetune_orig/checkpoints --log.metrics=runs/llava15_finetune_orig/metrics.jsonl \
  --log.tensorboard=runs/llava15_finetune_orig/tb "${tiny[@]}" --train.steps=2 --optim.warmup=1
expect release-original "original LLaVA layout"
expect release-original "vision tower: model.vision.init"
expect release-original "model.vision.resize = pad_square"

echo "summary"
$py - <<'PY'
import json, os, struct
import numpy as np

def tensors(path):
    """name -> (dtype, raw bytes) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, base, out = json.loads(f.read(n)), 8 + n, {}
        for k, v in header.items():
            if k != "__metadata__":
                f.seek(base + v["data_offsets"][0])
                out[k] = (v["dtype"], f.read(v["data_offsets"][1] - v["data_offsets"][0]))
    return out

def bf16(raw_f32):  # round to nearest even, as the export does
    u = np.frombuffer(raw_f32, dtype=np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()

def losses(run):
    rs = [json.loads(l) for l in open(f"runs/{run}/metrics.jsonl")]
    return f"{len(rs)} steps, loss {rs[0]['loss']:.4f} -> {rs[-1]['loss']:.4f}"
print(f"  stage 1: {losses('llava15_pretrain')} (projector only)")
print(f"  stage 2: {losses('llava15_finetune')} (decoder, embeddings, projector)")
for name, what in (("eval", "stage 2's checkpoint"), ("eval_export", "its llava-hf export")):
    e = json.load(open(f"runs/llava15_finetune/{name}.json"))
    print(f"  dhp eval of {what}: loss {e['real']['loss']:.4f} with the images, "
          f"{e['blanked']['loss']:.4f} blanked; token accuracy {100 * e['real']['accuracy']:.1f}%")
out = "runs/llava15_finetune/llava-hf"
cfg = json.load(open(f"{out}/config.json"))
tok = json.load(open(f"{out}/tokenizer_config.json"))
assert cfg["architectures"] == ["LlavaForConditionalGeneration"], cfg["architectures"]
assert cfg["image_token_index"] == 300 and cfg["text_config"]["vocab_size"] == 320, cfg
assert cfg["text_config"]["max_position_embeddings"] == 4096, cfg["text_config"]
assert cfg["torch_dtype"] == "bfloat16", cfg["torch_dtype"]
assert "curious user" in tok["chat_template"] and tok["legacy"] is False, tok
assert json.load(open(f"{out}/preprocessor_config.json")).get("do_pad") is True
# The tower was frozen in both stages: the export's is CLIP's (post_layernorm included), in
# bf16; the decoder trained in stage 2 and moved.
exp, clip = tensors(f"{out}/model.safetensors"), tensors("checkpoints/clip-vit-large-patch14-336/model.safetensors")
vic = tensors("checkpoints/vicuna-7b-v1.5/model.safetensors")
for k, (dt, raw) in clip.items():
    e = exp["vision_tower." + k]
    assert e == ("BF16", bf16(raw)), f"the export's {k} is not CLIP's"
moved = [k for k in vic if k != "model.embed_tokens.weight" and k != "lm_head.weight"
         and exp["language_model." + k][1] != bf16(vic[k][1])]
assert moved, "stage 2 left the decoder as Vicuna's"
files = sorted(os.listdir(out))
print(f"  export {out}: {', '.join(files)}")
print(f"    {len(exp)} tensors; the tower's {len(clip)} equal CLIP's (post_layernorm included), "
      f"{len(moved)} of the decoder's {len(vic) - 2} moved")
print(f"    LlavaForConditionalGeneration, image_token_index {cfg['image_token_index']}, pad_token_id "
      f"{cfg['pad_token_id']}, vocab {cfg['text_config']['vocab_size']} rows, "
      f"max_position_embeddings {cfg['text_config']['max_position_embeddings']}, {cfg['torch_dtype']}")
PY
$py -c 'import sys; print("  generated (a random tiny model: bytes, not words):", repr(open(sys.argv[1], "rb").read().splitlines()[-1][:60]))' logs/generate.log
echo "every command of docs/llava.md (but the .bin conversion) ran, in $((SECONDS - start)) s"
