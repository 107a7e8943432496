#!/usr/bin/env bash
# LLaVA's stage 1 at demo size (configs/stage1.toml): compose a language model and a CLIP
# tower with a fresh projector and train the projector alone. Makes its two inputs first, in
# Hugging Face's layout, as a user would bring them:
#   runs/stage1/llama  the demo model's decoder after a short run (plain template), exported
#                      by `dhp export --format hf` (LlamaForCausalLM)
#   runs/stage1/clip   a small CLIPVisionModel with random weights
#                      (tests/reference/make_hf_llava_fixture.py; needs python3-torch)
# Extra arguments go to the stage-1 `dhp train` as overrides, e.g. --train.steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
if [ ! -f data/demo/tokenizer.model ] || [ "$(wc -l < data/demo/train.jsonl)" -ne 8000 ]; then
  ./build/dhp data synth --out data/demo --train 8000 --val 300 --force
fi
run=runs/stage1
rm -rf "$run"
mkdir -p "$run"
# The language model: the demo's decoder after 300 steps with the plain template.
./build/dhp train --config configs/demo.toml --data.template=plain --train.steps=300 \
  --eval.every=0 --eval.blank_images=false --checkpoint.dir="$run/lm" \
  --log.metrics="$run/lm_metrics.jsonl" --log.progress=false
./build/dhp export --format hf --dir "$run/lm" -o "$run/llama"
# The tower: a CLIP vision model of the shape configs/stage1.toml names.
/usr/bin/python3 tests/reference/make_hf_llava_fixture.py "$run/clip" clip_vision \
  --vhidden 64 --vheads 4 --vlayers 2 --vffn 128 --patch 8 --image-size 32 --seed 7
./build/dhp train --config configs/stage1.toml "$@"
