#!/usr/bin/env bash
# Set-up plus the demo: builds dhp, writes the synthetic shapes-captioning data set, trains the
# small model of configs/demo.toml on the CPU and evaluates it on the held-out split, with the
# real images and with the images blanked. Extra arguments go to `dhp train` as overrides,
# e.g. scripts/demo.sh --train.steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
if [ ! -f data/demo/tokenizer.model ] || [ "$(wc -l < data/demo/train.jsonl)" -ne 8000 ]; then
  ./build/dhp data synth --out data/demo --train 8000 --val 300 --force
fi
# Each demo run starts afresh: its checkpoints and metrics go to runs/demo/.
rm -rf runs/demo
./build/dhp train --config configs/demo.toml "$@"
