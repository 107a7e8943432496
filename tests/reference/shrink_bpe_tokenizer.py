#!/usr/bin/env python3
"""A real byte-level BPE tokenizer cut down to its first merges, for tests whose tiny models
cannot afford a 150k-row embedding.

    shrink_bpe_tokenizer.py SRC_DIR OUT_DIR [--merges 1000]

SRC_DIR holds a Hugging Face tokenizer.json and tokenizer_config.json whose vocabulary is
GPT-2's layout (ids 0-255 the byte alphabet and id 256 + i the result of merge i) and whose
post-processor names no token ids: Qwen's. Other files are refused with the reason (Llama-3's
merges are not in id order, and its post-processor names ids). OUT_DIR gets the same files with the first --merges merges, the vocabulary they
produce, and the added tokens renumbered, in their order, right after it; everything else
(normalizer, pre-tokenizer regex, post-processor, decoder, chat template, special-token
names) is the file's own. The result tokenizes as the original does wherever the first merges
suffice, and is an ordinary tokenizer.json to any reader.
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--merges", type=int, default=1000)
    a = ap.parse_args()
    tok = json.load(open(os.path.join(a.src, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(a.src, "tokenizer_config.json"), encoding="utf-8"))
    model = tok["model"]
    vocab, merges = model["vocab"], model["merges"]
    keep = 256 + a.merges
    for i, m in enumerate(merges[: a.merges]):
        left, right = m if isinstance(m, list) else m.split(" ", 1)
        if vocab.get(left + right) != 256 + i or vocab[left] >= keep or vocab[right] >= keep:
            sys.exit(f"{a.src}: merge {i} ({left!r} {right!r}) is not id {256 + i}: not GPT-2's layout")
    model["vocab"] = {s: i for s, i in vocab.items() if i < keep}
    model["merges"] = merges[: a.merges]
    if "ids" in json.dumps(tok.get("post_processor")):
        sys.exit(f"{a.src}: the post-processor names token ids, which this script does not renumber")
    renumber = {}
    for j, t in enumerate(tok["added_tokens"]):
        renumber[t["id"]] = keep + j
        t["id"] = keep + j
    decoder = cfg.get("added_tokens_decoder", {})
    unknown = [k for k in decoder if int(k) not in renumber]
    if unknown:
        sys.exit(f"{a.src}: tokenizer_config.json's added_tokens_decoder has ids {unknown} that "
                 "tokenizer.json's added_tokens lacks")
    cfg["added_tokens_decoder"] = {str(renumber[int(k)]): v for k, v in decoder.items()}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    print(keep + len(tok["added_tokens"]))


if __name__ == "__main__":
    main()
