#!/usr/bin/env python3
"""Independent reference for the ids/labels ORIGINAL LLaVA training produces for a conversation.

Follows haotian-liu/LLaVA (llava/train/train.py, llava/mm_utils.py, llava/conversation.py, as of
commit 879ef31 "Fix training.") on top of a re-implementation of transformers' slow
`LlamaTokenizer` (models/llama/tokenization_llama.py, 4.37-4.45) over the real sentencepiece.

  llava_ids.py TEMPLATE TOKENIZER_DIR IN_JSONL OUT_JSONL [--model-max-length N]
  llava_ids.py render TEMPLATE IN_JSONL OUT_JSONL
  llava_ids.py encode TOKENIZER_DIR TEXTS_JSONL OUT    (one JSON string a line -> ids a line,
      no bos: as apply_chat_template tokenizes a rendered chat_template)
  llava_ids.py --self-test
TEMPLATE: llava_v1 (conv_llava_v1, "curious human"), vicuna_v1 (conv_vicuna_v1, "curious user"), plain.
"""
import json, os, re, sys, tempfile
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

IGNORE_INDEX, IMAGE_TOKEN_INDEX, DEFAULT_IMAGE_TOKEN = -100, -200, "<image>"  # llava/constants.py
SPIECE_UNDERLINE = "\u2581"


class SlowLlamaTokenizer:
    """transformers LlamaTokenizer (slow); only <s>, </s>, <unk> are recognised as added tokens."""

    def __init__(self, folder, legacy=None):
        cfg_path = os.path.join(folder, "tokenizer_config.json")
        cfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.exists(cfg_path) else {}
        legacy = cfg.get("legacy") if legacy is None else legacy
        self.legacy = True if legacy is None else bool(legacy)  # __init__: `if legacy is None: ... legacy = True`
        self.add_bos_token = cfg.get("add_bos_token", True)
        self.add_eos_token = cfg.get("add_eos_token", False)
        prefix = cfg.get("add_prefix_space")  # absent before ~4.40, where the prefix was always added
        self.add_prefix_space = True if prefix is None else bool(prefix)

        def content(key, default):
            v = cfg.get(key)
            return v.get("content", default) if isinstance(v, dict) else (v or default)
        self.special = [content("bos_token", "<s>"), content("eos_token", "</s>"), content("unk_token", "<unk>")]
        self.bos_token, self.eos_token, self.unk_token = self.special
        # lstrip/rstrip of those AddedTokens (False unless tokenizer_config's added_tokens_decoder says so)
        self.strip = {t: (False, False) for t in self.special}
        for ent in (cfg.get("added_tokens_decoder") or {}).values():
            if ent.get("content") in self.strip:
                self.strip[ent["content"]] = (bool(ent.get("lstrip")), bool(ent.get("rstrip")))
        # Tokens added after the vocabulary (llava-hf's <image>, <pad>: added_tokens.json), split
        # out of the text as the special tokens are (the added-tokens trie of tokenize()).
        added_path = os.path.join(folder, "added_tokens.json")
        self.added = json.load(open(added_path, encoding="utf-8")) if os.path.exists(added_path) else {}
        for t in self.added:
            self.strip.setdefault(t, (False, False))
        self.split_re = re.compile("(" + "|".join(re.escape(t) for t in sorted(
            self.special + list(self.added), key=len, reverse=True)) + ")")

        # get_spm_processor: legacy (or from_slow) loads the file as is; otherwise the proto is
        # reloaded with normalizer_spec.add_dummy_prefix = False.
        model_file = os.path.join(folder, "tokenizer.model")
        self.sp = spm.SentencePieceProcessor()
        if self.legacy or cfg.get("from_slow", False):
            self.sp.Load(model_file)
        else:
            proto = model_pb2.ModelProto()
            proto.ParseFromString(open(model_file, "rb").read())
            proto.normalizer_spec.add_dummy_prefix = False
            self.sp.LoadFromSerializedProto(proto.SerializeToString())
        # unk_token_length property: len(self.sp_model.encode(str(self.unk_token)))
        self.unk_token_length = len(self.sp.encode(self.unk_token))
        self.bos_token_id, self.eos_token_id, self.unk_token_id = map(self.sp.piece_to_id, self.special)

    def _split_on_special(self, text):
        # PreTrainedTokenizer.tokenize: tokens_trie.split on added tokens, honour their
        # rstrip/lstrip on the neighbours, skip empty pieces, _tokenize the rest.
        parts = self.split_re.split(text)  # odd positions hold the special tokens
        for i in range(1, len(parts), 2):
            lstrip, rstrip = self.strip[parts[i]]
            parts[i + 1] = parts[i + 1].lstrip() if rstrip else parts[i + 1]
            parts[i - 1] = parts[i - 1].rstrip() if lstrip else parts[i - 1]
        return [t for i, part in enumerate(parts) if part for t in ([part] if i % 2 else self._tokenize(part))]

    def _tokenize(self, text):
        # LlamaTokenizer._tokenize: legacy, or text not starting with "▁"/" ": plain sp encode;
        # else encode unk_token + text and drop the unk's pieces.
        if self.legacy or not text.startswith((SPIECE_UNDERLINE, " ")):
            return self.sp.encode(text, out_type=str)
        pieces = self.sp.encode(self.unk_token + text, out_type=str)
        return pieces[self.unk_token_length:] if len(pieces) >= self.unk_token_length else pieces

    def tokenize(self, text):
        # LlamaTokenizer.tokenize: non-legacy replaces "▁" by " ", prepends "▁" (add_prefix_space),
        # and drops a leading lone "▁" that is followed by a special token.
        if self.legacy or len(text) == 0:
            return self._split_on_special(text)
        text = text.replace(SPIECE_UNDERLINE, " ")
        if self.add_prefix_space:
            text = SPIECE_UNDERLINE + text
        tokens = self._split_on_special(text)
        if len(tokens) > 1 and tokens[0] == SPIECE_UNDERLINE and (tokens[1] in self.special or tokens[1] in self.added):
            tokens = tokens[1:]
        return tokens

    def ids(self, text):
        # tokenize + convert_tokens_to_ids, no special tokens added
        return [self.added[t] if t in self.added else self.sp.piece_to_id(t) for t in self.tokenize(text)]

    def __call__(self, text):
        # encode -> convert_tokens_to_ids -> build_inputs_with_special_tokens (bos + ids [+ eos])
        ids = self.ids(text)
        return ([self.bos_token_id] if self.add_bos_token else []) + ids + \
               ([self.eos_token_id] if self.add_eos_token else [])




def tokenizer_image_token(prompt, tok):
    # llava/mm_utils.py tokenizer_image_token: each "<image>"-separated chunk tokenized with bos,
    # the leading bos kept once, IMAGE_TOKEN_INDEX between chunks.
    chunks = [tok(c) for c in prompt.split(DEFAULT_IMAGE_TOKEN)]
    offset = 1 if chunks and chunks[0] and chunks[0][0] == tok.bos_token_id else 0
    ids = chunks[0][:offset]
    sep = [IMAGE_TOKEN_INDEX] * (offset + 1)  # insert_separator(chunks, sep), then x[offset:] of each
    for x in [e for chunk in chunks for e in (chunk, sep)][:-1]:
        ids.extend(x[offset:])
    return ids


TEMPLATES = {  # llava/conversation.py: conv_llava_v1 / conv_vicuna_v1 (SeparatorStyle.TWO), conv_llava_plain
    "llava_v1": "A chat between a curious human and an artificial intelligence assistant. "
                "The assistant gives helpful, detailed, and polite answers to the human's questions.",
    "vicuna_v1": "A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.",
    "plain": None,
}
ROLES, SEP, SEP2 = ("USER", "ASSISTANT"), " ", "</s>"


def preprocess_multimodal(source):
    # train.py preprocess_multimodal (no mmtag, no mm_use_im_start_end)
    for s in source:
        if DEFAULT_IMAGE_TOKEN in s["value"]:
            v = s["value"].replace(DEFAULT_IMAGE_TOKEN, "").strip()
            s["value"] = (DEFAULT_IMAGE_TOKEN + "\n" + v).strip()
    return source


def v1_prompt(template, source):
    # preprocess_v1 prompt part + Conversation.get_prompt for SeparatorStyle.TWO
    roles = {"human": ROLES[0], "gpt": ROLES[1]}
    bad = [s["from"] for s in source if s["from"] not in roles]  # LLaVA: KeyError in roles[...]
    if bad:
        raise ValueError("LLaVA conversations use from=human/gpt only, got %r" % bad[0])
    if roles[source[0]["from"]] != ROLES[0]:
        source = source[1:]  # "Skip the first one if it is not from human"
    ret = TEMPLATES[template] + SEP
    for j, s in enumerate(source):
        role = roles[s["from"]]
        assert role == ROLES[j % 2], "turns must alternate human/gpt"
        ret += (role + ": " + s["value"] + (SEP, SEP2)[j % 2]) if s["value"] else role + ":"
    return ret


def preprocess_v1(template, source, tok, has_image, max_len):
    conversation = v1_prompt(template, source)
    if has_image:
        input_ids = tokenizer_image_token(conversation, tok)
    else:
        input_ids = tok(conversation)[:max_len]  # tokenizer(..., max_length, truncation=True)
    target = list(input_ids)
    total_len = sum(1 for t in target if t != tok.unk_token_id)  # pad_token = unk_token in train()
    sep = SEP + ROLES[1] + ": "
    cur_len = 1
    target[:cur_len] = [IGNORE_INDEX] * cur_len
    for i, rou in enumerate(conversation.split(SEP2)):
        if rou == "":
            break
        parts = rou.split(sep)
        if len(parts) != 2:
            break
        parts[0] += sep
        enc = (lambda t: tokenizer_image_token(t, tok)) if has_image else tok
        round_len, instruction_len = len(enc(rou)), len(enc(parts[0])) - 2
        # `if i != 0 and not tokenizer.legacy and IS_TOKENIZER_GREATER_THAN_0_14:` (tokenizers > 0.14)
        if i != 0 and not tok.legacy:
            round_len, instruction_len = round_len - 1, instruction_len - 1
        span = slice(cur_len, cur_len + instruction_len)  # same slice semantics as the torch tensor
        target[span] = [IGNORE_INDEX] * len(target[span])
        cur_len += round_len
    target[cur_len:] = [IGNORE_INDEX] * len(target[cur_len:])
    if cur_len < max_len and cur_len != total_len:
        target = [IGNORE_INDEX] * len(target)
        print("WARNING: tokenization mismatch: %d vs. %d. (ignored)" % (cur_len, total_len), file=sys.stderr)
    return input_ids, target


def plain_prompt(source):
    # preprocess_plain: source[0]['value'] becomes "<image>"; "<image>" + caption + conv sep "\n"
    assert len(source) == 2 and DEFAULT_IMAGE_TOKEN in source[0]["value"], "plain needs <image> + caption"
    source[0]["value"] = DEFAULT_IMAGE_TOKEN
    return source[0]["value"] + source[1]["value"] + "\n"


def preprocess_plain(source, tok):
    input_ids = tokenizer_image_token(plain_prompt(source), tok)
    n = len(tokenizer_image_token(source[0]["value"], tok))
    return input_ids, [IGNORE_INDEX] * min(n, len(input_ids)) + input_ids[n:]


def prepare(rec):
    # LazySupervisedDataset.__getitem__: deep copy; preprocess_multimodal only for samples with an image
    source = [dict(s) for s in rec["conversations"]]
    if source and source[0].get("from") == "system":
        raise ValueError("a 'system' turn is not LLaVA's conversation format")
    return preprocess_multimodal(source) if rec.get("has_image") else source


def ids_for(template, rec, tok, max_len=2048):
    source, has_image = prepare(rec), bool(rec.get("has_image"))
    if template == "plain":
        return preprocess_plain(source, tok)
    return preprocess_v1(template, source, tok, has_image, max_len)


def render(template, rec):
    source = prepare(rec)
    return plain_prompt(source) if template == "plain" else v1_prompt(template, source)


def self_test():
    with tempfile.TemporaryDirectory() as d:
        lines = [TEMPLATES["llava_v1"], "USER: What is in the picture? ASSISTANT: A cat sitting on a mat.",
                 "USER: What color is it? ASSISTANT: It is black.", "Hello there. A dog, a cat and a bird."]
        open(os.path.join(d, "corpus.txt"), "w").write("\n".join(lines * 50) + "\n")
        spm.SentencePieceTrainer.train(
            input=os.path.join(d, "corpus.txt"), model_prefix=os.path.join(d, "tokenizer"), model_type="bpe",
            vocab_size=400, byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0,
            hard_vocab_limit=False, split_digits=True, allow_whitespace_only_pieces=True, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
        rec = {"has_image": True, "conversations": [
            {"from": "human", "value": "What is in the picture?\n<image>"},
            {"from": "gpt", "value": "A cat sitting on a mat."},
            {"from": "human", "value": "What color is it?"}, {"from": "gpt", "value": "It is black."}]}
        prompt = render("llava_v1", rec)
        print("prompt:", json.dumps(prompt))
        after = {}
        for legacy in (True, False):
            tok = SlowLlamaTokenizer(d, legacy=legacy)
            ids, labels = ids_for("llava_v1", rec, tok)
            print("legacy=%s input_ids=%s" % (legacy, ids))
            print("legacy=%s labels   =%s" % (legacy, labels))
            if all(t == IGNORE_INDEX for t in labels):  # LLaVA's round_len -= 1 assumes Llama's vocab,
                print("legacy=%s: LLaVA's mismatch guard masked every label" % legacy)  # where "USER" < "▁USER"
            k = ids.index(tok.eos_token_id)
            after[legacy] = [sp.id_to_piece(t) for t in ids[k + 1:k + 4]]
            print("legacy=%s pieces after first </s>: %s" % (legacy, after[legacy]))
            hello = tok.tokenize("Hello <s>.")  # the docstring example of `legacy`
            print("legacy=%s 'Hello <s>.' -> %s" % (legacy, hello))
            assert hello[hello.index("<s>") + 1].startswith(SPIECE_UNDERLINE) == legacy
            if legacy:  # each special-free piece of a chunk is plain sp.encode with the dummy prefix
                for chunk in prompt.split(DEFAULT_IMAGE_TOKEN):
                    want = [tok.bos_token_id]
                    for i, part in enumerate(tok.split_re.split(chunk)):
                        want += [sp.piece_to_id(part)] if i % 2 else (sp.encode(part) if part else [])
                    assert tok(chunk) == want, (chunk, tok(chunk), want)
        assert after[True][0].startswith(SPIECE_UNDERLINE) and not after[False][0].startswith(SPIECE_UNDERLINE)
        print("self-test OK: second-round USER is %s (legacy) vs %s (legacy=False)" % (after[True], after[False]))


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    if argv[:1] == ["encode"] and len(argv) == 4:  # encode TOKENIZER_DIR TEXTS_JSONL OUT
        tok = SlowLlamaTokenizer(argv[1])  # as apply_chat_template: add_special_tokens=False
        with open(argv[2], encoding="utf-8") as fin, open(argv[3], "w", encoding="utf-8") as fout:
            for line in fin:
                if line.strip():
                    fout.write(" ".join(str(i) for i in tok.ids(json.loads(line))) + "\n")
        return
    max_len = 2048  # LLaVA-1.5 scripts pass --model_max_length 2048
    if "--model-max-length" in argv:
        k = argv.index("--model-max-length")
        max_len, argv = int(argv[k + 1]), argv[:k] + argv[k + 2:]
    if len(argv) != 4 or argv[argv[0] == "render"] not in TEMPLATES:
        sys.exit(__doc__)
    is_render = argv[0] == "render"
    template, src, dst = argv[1 if is_render else 0], argv[2], argv[3]
    tok = None if is_render else SlowLlamaTokenizer(argv[1])
    with open(src, encoding="utf-8") as fin, open(dst, "w", encoding="utf-8") as fout:
        for line in fin:
            if line.strip():
                rec = json.loads(line)
                if is_render:
                    fout.write(json.dumps(render(template, rec), ensure_ascii=False) + "\n")
                else:
                    ids, labels = ids_for(template, rec, tok, max_len)
                    fout.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
