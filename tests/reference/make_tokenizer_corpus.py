#!/usr/bin/python3
"""Writes the corpus that tests/test_hf_tokenizer.cpp tokenizes with dhp and with Hugging Face
`tokenizers` (tests/reference/hf_tokenize.js), and compares id for id.

Usage:
  make_tokenizer_corpus.py OUT_JSONL [--invalid OUT_BYTES] [--seed 20240611] [--lines 16000]

OUT_JSONL (JSON Lines): every line is one JSON string written with ensure_ascii, so a text may
hold newlines, "\\r\\n", tabs, NUL and any code point; the file itself is ASCII. Surrogate
code points never occur (they cannot be encoded in UTF-8).

OUT_BYTES (--invalid): raw bytes, texts separated by "\\n", each text holding ill-formed UTF-8
(stray continuation bytes, truncated sequences, overlongs, surrogates, code points past
U+10FFFF, 0xFE/0xFF) between valid text. dhp replaces every maximal invalid subsequence by
U+FFFD, exactly as Python's bytes.decode("utf-8", "replace") and the WHATWG decoder do.

Deterministic: the same arguments always give the same bytes (random.Random(seed), the
standard library's unicodedata for the code-point sweep, no clock, no environment).

Sections (the random part fills the remainder up to --lines):
  1. every code point of planes 0-3 and 14 (and samples of the others), 64 per line, each in
     a few contexts ("a" c "1" c " "), so that a character the regexes classify differently
     (\\p{L}, \\p{N}, \\p{M}, \\p{P}, \\p{S}, \\s) changes the split;
  2. the NFD and NFKD forms of every code point that has one, and combining marks in
     non-canonical order (what NFC/NFKC compose and reorder);
  3. hand-written cases: contractions in both cases, special-token strings and near misses,
     whitespace runs (some 10,000 characters long), numbers of every length, emoji ZWJ
     sequences, skin tones, flags, tags, NFKC-sensitive characters, control characters, BOM,
     U+FFFD, U+200B, code and JSON;
  4. random mixtures of all of the above with words from many scripts.
"""
import argparse
import json
import random
import sys
import unicodedata

SPECIAL_STRINGS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_5|>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|vision_start|>", "<tool_call>",
    "</tool_call>", "<think>", "</think>", "<s>", "</s>", "<unk>", "<bos>", "<eos>", "<pad>",
    "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
    "<image_soft_token>", "<unused0>", "<unused12>", "<unused6241>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>", "<\uff5ctool\u2581calls\u2581begin\uff5c>",
]
NEAR_MISSES = [
    "<|im_start|", "<|im_start", "|im_start|>", "<|im_star|>", "<|IM_START|>", "< s>", "<S>",
    "<s >", "<<s>>", "<s><s>", "</s/>", "<bos", "bos>", "<start_of_turn", "<|eot_id|",
    "<|begin_of_text|><|begin_of_text|>", "<|im_start|>>", "<<|im_start|>", "<unused>",
    "<unused-1>", "<unused62410>", "<|endoftext|>x", "x<|endoftext|>", " <s> ", "\n<s>\n",
    "<\uff5cbegin of sentence\uff5c>", "<|begin\u2581of\u2581sentence|>", "<think", "</think",
]
CONTRACTIONS = [
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
    "'Re", "'rE", "'Ll", "'lL", "'Ve", "'\u017f", "'\u212a", "\u2019s", "\u2019ll", "''s",
    "'", "''", "'x", "'sa", "'tis", "'ld",
]
WORDS_EN = (
    "the of and to in is you that it he was for on are as with his they I at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her would "
    "make like him into time has look two more write go see number no way could people my than "
    "first water been call who oil its now find long down day did get come made may part "
    "don't can't won't isn't it's I'm you're they've we'll he'd She's WE'LL DON'T IT'S YOU'RE "
    "tokenization Hugging Face transformers preprocessing encoder-decoder state-of-the-art "
    "e-mail naïve café résumé coöperate façade jalapeño Zürich São Paulo Ångström Øresund"
).split()
PHRASES = [
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u6df1\u5ea6\u5b66\u4e60\u6a21\u578b\u9700\u8981\u5927\u91cf\u7684\u6570\u636e\u548c\u8ba1\u7b97\u8d44\u6e90",
    "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
    "\uff76\uff80\uff76\uff85 \uff8a\uff9d\uff76\uff78 \u30cf\u309a \u30ac",
    "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f \u0627\u0644\u0652\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629\u064f",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd! \u05d1\u05bc\u05b0\u05e8\u05b5\u05d0\u05e9\u05b4\u05c1\u05d9\u05ea",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e\u0964 \u0915\u093c \u0958 \u0921\u093c\u093e\u0915",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u043b\u043a\u0430 \u0438 \u0439\u043e\u0433\u0443\u0440\u0442.",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07\u0e27\u0e48\u0e32\u0e07",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5\u0387 \u1f00\u03c1\u03c7\u1f74 \u03ac\u03ad\u03ae",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u: \u0111\u01b0\u1ee3c, ng\u01b0\u1eddi, th\u1ebf gi\u1edbi",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u0532\u0561\u0580\u0587 \u1230\u120b\u121d \u0f56\u0f7c\u0f51\u0f0b\u0f61\u0f72\u0f42",
    "\u1019\u103c\u1014\u103a\u1019\u102c \u1781\u17d2\u1798\u17c2\u179a \u0dc3\u0dd2\u0d82\u0dc4\u0dbd \u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u09ac\u09be\u0982\u09b2\u09be",
    "\u182e\u1823\u1829\u182d\u1823\u182f\u180e\u1820 \u13e3\u13b3\u13a9 \u2c00\u2c01",
]
EMOJI = [
    "\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f1fa\U0001f1f8", "\U0001f1ef\U0001f1f5\U0001f1e9\U0001f1ea",
    "1\ufe0f\u20e3", "#\ufe0f\u20e3", "\U0001f9d1\U0001f3ff\u200d\U0001f680", "\u2764\ufe0f",
    "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f", "\U0001f469\U0001f3fb\u200d\U0001f4bb",
    "\u263a", "\u263a\ufe0e", "\U0001f44b\U0001f3fc", "\U0001fae0", "\U0001f9ec",
]
NFKC_SENSITIVE = [
    "\ufb01", "\ufb02", "\ufb00", "\uff21\uff22\uff23", "\uff10\uff11\uff12", "\u00b9\u00b2\u00b3\u2074",
    "\u2081\u2082", "\u338f", "\u337f", "\u210c", "\u2121", "\u2122", "\u3131\u314f", "\u2460\u2461",
    "\u2168", "\u00bd", "\u00b5", "\u03bc", "\u212b", "\u2126", "\u212a", "\u017f", "\u1e9b\u0323",
    "\u2024", "\u2025", "\u2026", "\u00a0", "\u3000", "\uff61", "\ufe59", "\u2002", "\u1d43", "\u02b0",
    "\u33a1", "\u3250", "\U0001d400\U0001d41a", "\U0001f130", "\uFDFA", "\u0132", "\u01c4",
]
COMBINING = [
    "e\u0301", "A\u030a", "a\u0301\u0316", "a\u0316\u0301", "o\u0308\u0304", "u\u031b\u0309",
    "\u1100\u1161", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u110b\u116e\u11bc",
    "\u0915\u093c", "\u0928\u093c", "\u05e9\u05bc\u05c1", "\u0627\u0653", "\u0648\u0654",
    "\u0301", "\u0301\u0301\u0301", " \u0301", "\u200d\u0301", "i\u0307", "\u0399\u0308\u0301",
    "\u1e0b\u0323", "q\u0307\u0323", "\u00c5\u0301", "\u0d4a", "\u0d46\u0d3e", "\u0b47\u0b3e",
    "\U00011935\U00011930", "\U00011938", "\u0345", "\u03b1\u0345\u0301",
]
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ",
              " \t ", "\u00a0", "\u3000", "\u2009", "\u0085", "\u180e", "\u2028", "\u2029",
              "\u200b", "\ufeff", "\u000b", "\u000c", "\u1680", "\u202f", "\u205f", "\u200a"]
CONTROL = ["\u0000", "\u0001", "\u0007", "\u0008", "\u001b", "\u001f", "\u007f", "\u0080",
           "\u009f", "\ufffd", "\ufffe", "\uffff", "\U0010ffff", "\ue000", "\U000f0000",
           "\u200e", "\u200f", "\u202e", "\u2066", "\u00ad", "\u034f", "\ufe0f", "\U000e0001"]
CODE = [
    'def f(x: int) -> int:\n    return x**2 + 3*x - 1  # comment\n',
    'for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }',
    'const re = /\\s+(?!\\S)/gu; console.log(`${a}:${b}`);',
    '{"name": "dhp", "version": "0.1.0", "deps": ["fmt", "icu"], "nested": {"a": [1, 2.5e-3, null, true]}}',
    '<html><body class="x">Hello &amp; welcome</body></html>',
    'SELECT id, COUNT(*) FROM t WHERE name LIKE \'%foo%\' GROUP BY id;',
    '\\begin{equation} E = mc^2 \\end{equation} $\\alpha_i^{(t)}$',
    'https://example.com/path?q=1&r=%20x#frag user@example.org C:\\Users\\me\\file.txt',
    '| col1 | col2 |\n|------|------|\n| 1    | 2    |',
    '#include <vector>\nint main() {\n\treturn 0;\n}\n',
    '    if x:\n        pass\n\n\n    else:\n\t\tyield',
    'git commit -m "fix: handle \\r\\n" && echo $?',
    '0x1F 0b1010 1e10 3.14159 -42 +7 1,000,000 12:30:45 2024-06-11',
]


def sweep_lines():
    """Every code point of planes 0-3 and 14 (surrogates excluded), then every 61st of the
    others, 64 per line, each as "a" c "1" c " "."""
    cps = [c for c in range(0x40000) if not 0xD800 <= c <= 0xDFFF]
    cps += list(range(0xE0000, 0xF0000))
    cps += list(range(0x40000, 0xE0000, 61)) + list(range(0xF0000, 0x110000, 61))
    for i in range(0, len(cps), 64):
        yield "".join("a%s1%s " % (chr(c), chr(c)) for c in cps[i:i + 64])


def decomposition_lines():
    """NFD and NFKD forms of every code point that has one (Unicode of this Python), 48 per
    line, separated by "|" (a starter, so forms do not interact)."""
    forms = []
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        ch = chr(c)
        for form in ("NFD", "NFKD"):
            d = unicodedata.normalize(form, ch)
            if d != ch and d not in forms[-2:]:
                forms.append(d)
    for i in range(0, len(forms), 48):
        yield "|".join(forms[i:i + 48])


def random_word(rng):
    kind = rng.random()
    if kind < 0.35:
        w = rng.choice(WORDS_EN)
        return w.upper() if rng.random() < 0.1 else (w.capitalize() if rng.random() < 0.2 else w)
    if kind < 0.6:
        p = rng.choice(PHRASES)
        a = rng.randrange(len(p))
        return p[a:a + rng.randint(1, 12)]
    if kind < 0.7:
        return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 6)))
    if kind < 0.78:
        return str(rng.randint(0, 10 ** rng.randint(1, 25)))
    if kind < 0.84:
        return rng.choice(CONTRACTIONS)
    if kind < 0.88:
        return rng.choice(EMOJI)
    if kind < 0.91:
        return rng.choice(COMBINING)
    if kind < 0.94:
        return rng.choice(NFKC_SENSITIVE)
    if kind < 0.96:
        return rng.choice(SPECIAL_STRINGS + NEAR_MISSES)
    if kind < 0.98:
        return rng.choice(CONTROL)
    # any scalar value of the BMP or plane 1
    c = rng.randint(0x20, 0x1FFFF)
    return chr(c) if not 0xD800 <= c <= 0xDFFF else "?"


def random_line(rng):
    n = rng.choice([1, 2, 3, 5, 8, 13, 21, 40])
    out = []
    for _ in range(n):
        out.append(random_word(rng))
        r = rng.random()
        if r < 0.7:
            out.append(" ")
        elif r < 0.8:
            out.append(rng.choice(WHITESPACE))
        elif r < 0.9:
            out.append(rng.choice(".,;:!?-()[]{}\"'/\\@#$%^&*_=+<>|~`"))
    if rng.random() < 0.1:
        out.insert(0, rng.choice(WHITESPACE))
    return "".join(out)


def handwritten_lines(rng):
    lines = ["", " ", "a", "\n", "\r\n", "\t", "Hello world", " Hello world", "Hello  world ",
             "hello\nworld", "I'm here, you're there, they've gone, we'll see, he'd know, it's ok, don't",
             "I'M HERE, YOU'RE THERE, THEY'VE GONE, WE'LL SEE, HE'D KNOW, IT'S OK, DON'T",
             "It'S mIxEd 'Ll 'rE 'vE", "'s 't 're 've 'm 'll 'd", "'S'T'RE'VE'M'LL'D"]
    for s in SPECIAL_STRINGS + NEAR_MISSES:
        lines += [s, "x" + s + "y", "Hello " + s + " world", s + s, " " + s, s + " ", s + "\n",
                  "\u00e9" + s + "\u0301", "123" + s + "456", s.lower(), s.upper()]
    for c in CONTRACTIONS:
        lines += ["it" + c, "IT" + c + " x", "x " + c, c + c, "don" + c + "t"]
    for w in WHITESPACE:
        for n in (1, 2, 3, 7, 33):
            lines += ["a" + w * n + "b", w * n, w * n + "word", "word" + w * n, "!" + w * n + "!"]
    for w in (" ", "\t", "\n", "\r\n", " \t", "\u3000", " \n "):
        lines += [w * (10000 // len(w)), "start" + w * (10000 // len(w)) + "end",
                  w * (10000 // len(w)) + "x", "x" + w * (10000 // len(w))]
    for n in range(1, 41):
        digits = "".join(str((i * 7 + n) % 10) for i in range(n))
        lines += [digits, "x" + digits + "y", " " + digits, digits + ".5", "-" + digits,
                  ",".join(digits[i:i + 3] for i in range(0, n, 3))]
    for d in ("\u0660\u0661\u0662\u0663", "\u0966\u0967\u0968", "\uff11\uff12\uff13", "\u00b2\u00b3",
              "\u2160\u2161\u216b", "\u2460\u2461", "\U0001d7ce\U0001d7cf", "\u0e51\u0e52", "\u4e00\u4e8c\u4e09",
              "\u00bd\u2153", "\u3007", "\U00010d40"):
        lines += [d, "1" + d + "2", "x" + d, d * 5]
    lines += EMOJI + ["".join(EMOJI), " ".join(EMOJI)]
    lines += NFKC_SENSITIVE + ["".join(NFKC_SENSITIVE), " ".join(NFKC_SENSITIVE)]
    lines += COMBINING + ["".join(COMBINING), " ".join(COMBINING)]
    lines += CONTROL + ["".join(CONTROL), " ".join(CONTROL), "\ufeffBOM at start", "mid\ufeffdle"]
    lines += CODE + ["\n".join(CODE)]
    lines += PHRASES + [" ".join(PHRASES)]
    # long words without spaces (one BPE word for the SentencePiece-style tokenizers)
    lines += ["a" * 5000, "ab" * 2500, "\u4e00" * 3000, "\U0001f600" * 1000, "x\u0301" * 2000,
              "".join(chr(rng.randint(0x61, 0x7A)) for _ in range(6000))]
    lines += [random_line(rng) * rng.randint(20, 60) for _ in range(40)]
    return lines


def invalid_lines(rng):
    """Ill-formed UTF-8 byte strings (no 0x0A inside)."""
    cases = [
        b"\x80", b"\xbf", b"\x80\x80\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xc2", b"\xc2A", b"\xe0\x80\xaf",
        b"\xe0\xa0", b"\xe0\xa0A", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\x9f\xbf", b"\xef\xbf",
        b"\xf0\x80\x80\x80", b"\xf0\x90\x80", b"\xf0\x90\x80A", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
        b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xfe\xff", b"\xef\xbb\xbf\xff", b"\xe2\x82",
        b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80\x80", b"\xc3\xa9\x80", b"\xe2\x82\xac\xe2\x82",
        b"<|im_start|\xff>", b"<|im\xffstart|>", b"\xff<|im_start|>\xff", b"<s>\x80</s>",
        b"Hello \xff world", b"caf\xe9", b"na\xefve", b"\x00\xff\x00", b"\r\xff\r\n",
        b"'\xffs", b"1\xff2\xff3", b" \xff ", b"\xe4\xbd\xa0\xe5\xa5", b"\xe4\xbd\xa0\xe5\xa5\xbd",
    ]
    out = list(cases)
    for _ in range(400):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.4:
                parts.append(random_word(rng).encode("utf-8"))
            elif r < 0.7:
                parts.append(rng.choice(cases))
            else:
                parts.append(bytes(rng.randint(0x80, 0xFF) for _ in range(rng.randint(1, 4))))
            parts.append(b" " if rng.random() < 0.6 else b"")
        out.append(b"".join(parts))
    return [line.replace(b"\n", b" ") for line in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--invalid")
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--lines", type=int, default=16000, help="random lines added")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    lines = list(sweep_lines()) + list(decomposition_lines()) + handwritten_lines(rng)
    lines += [random_line(rng) for _ in range(args.lines)]
    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=True) + "\n")
    if args.invalid:
        with open(args.invalid, "wb") as f:
            for line in invalid_lines(rng):
                f.write(line + b"\n")
    print("make_tokenizer_corpus: %d lines in %s" % (len(lines), args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
