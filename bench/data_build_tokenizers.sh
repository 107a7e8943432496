#!/usr/bin/env bash
# `dhp data build` of one LLaVA-style set (the `mixed` preset: images, several per sample,
# some videos; 100,000 samples by default) with SentencePiece and with byte-level BPE
# tokenizer.json files, each with its family's template, built in turn REPEATS times; prints
# bench_data's table (median wall time, its range, the median CPU seconds and the CPU ratio to
# the first row).
#   bench/data_build_tokenizers.sh BUILD_DIR [SAMPLES] [REPEATS]
# Rows: the set's own SentencePiece model (what `dhp data synth` trains); a Llama-style
# SentencePiece BPE model (byte fallback, digits split) trained on the set's text with as many
# pieces as that text supports; Qwen3's and Llama-3.1's tokenizer.json (the real files of
# scripts/fetch_references.sh) with chatml and llama3.
set -euo pipefail
build=$(cd "$1" && pwd)
samples=${2:-100000}
repeats=${3:-3}
src=$(cd "$(dirname "$0")/.." && pwd)
refs="$src/.cache/references"
set_dir=${BENCH_SET:-/tmp/dhp_bench_tokenizers_$samples}
for f in qwen3 llama3_1; do
  [ -f "$refs/$f/tokenizer.json" ] || { echo "no $refs/$f/tokenizer.json: run scripts/fetch_references.sh"; exit 1; }
done
if [ ! -f "$set_dir/train.jsonl" ]; then
  "$build/dhp" data synth --preset mixed --train "$samples" --val 10 --scale 0.1 --factor 16 \
    --out "$set_dir" --force >/dev/null
fi
if [ ! -f "$set_dir/sp_bpe/tokenizer.model" ]; then
  mkdir -p "$set_dir/sp_bpe"
  /usr/bin/python3 - "$set_dir" <<'PY'
import json, sys
import sentencepiece as spm
d = sys.argv[1]
with open(f"{d}/sp_bpe/corpus.txt", "w") as out:
    for line in open(f"{d}/train.jsonl"):
        for turn in json.loads(line)["conversations"]:
            out.write(turn["value"].replace("<image>", "").replace("<video>", "") + "\n")
# Llama-2's trainer settings where they apply; hard_vocab_limit off: the synthetic text has
# few distinct words, so the vocabulary stops where the text does.
spm.SentencePieceTrainer.train(
    input=f"{d}/sp_bpe/corpus.txt", model_prefix=f"{d}/sp_bpe/tokenizer", model_type="bpe",
    vocab_size=4000, hard_vocab_limit=False, byte_fallback=True, split_digits=True,
    character_coverage=0.99995, input_sentence_size=200000, shuffle_input_sentence=True,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
PY
fi
OPENCV_FOR_THREADS_NUM=1 "$build/bench/bench_data" --data "$set_dir" --out /tmp/dhp_bench_tokenizers_out \
  --repeats "$repeats" --tokenizer "$set_dir/tokenizer.model:llava_v1" \
  --tokenizer "$set_dir/sp_bpe/tokenizer.model:llava_v1" --tokenizer "$refs/qwen3:chatml" \
  --tokenizer "$refs/llama3_1:llama3"
