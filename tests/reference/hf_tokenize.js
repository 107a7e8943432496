#!/usr/bin/env node
// Reference ids from Hugging Face `tokenizers` (the Rust library, 0.22.2, as the Node addon
// @anush008/tokenizers-linux-x64-gnu that scripts/fetch_references.sh puts in
// .cache/references/tokenizers-node/). dhp's HfTokenizer (data/hf_tokenizer.h) is compared
// with what this script writes.
//
//   node hf_tokenize.js encode TOKENIZER_JSON CORPUS OUT [--add-special] [--raw] [--fnv]
//       One output line per corpus line: the ids, separated by single spaces (an empty line
//       when there are none); with --fnv, instead the FNV-1a 32-bit hash of that line (8 hex
//       digits), to keep the output of huge inputs small.
//   node hf_tokenize.js decode TOKENIZER_JSON IDS OUT [--skip-special] [--probe]
//       IDS holds lines of space-separated ids (what encode writes without --fnv); OUT gets one
//       JSON string per line. With --probe, one more row is decoded, [0, 1, 2, 3, V-1, V+5, -1]
//       (V: the library's vocabulary size with the added tokens: special tokens, the last id,
//       unknown ids), and OUT ends with a line holding that row as a JSON array.
//   node hf_tokenize.js batch JOBS
//       JOBS holds one JSON object a line, {"mode": "encode" or "decode", "tokenizer": FILE,
//       "input": FILE, "out": FILE, "flags": ["--add-special", ...]}: each job as the modes above
//       would run it, all in this one process; consecutive jobs of the same tokenizer file load
//       it once. (Starting Node and loading a tokenizer cost about as much as encoding a
//       sample: tests/test_hf_tokenizer.cpp asks for all it needs in one batch.)
//   node hf_tokenize.js time TOKENIZER_JSON CORPUS [--repeats N]
//       Prints one JSON line {"bytes": B, "lines": L, "seconds": [s1, ...]}: wall time of
//       encoding the whole corpus (addSpecialTokens false) once per repeat, one encodeBatch
//       call per 256 lines. Run it with RAYON_NUM_THREADS=1 for a single-thread figure.
//
// Corpus formats:
//   default  JSON Lines: every line is one JSON string (so a text may hold newlines, tabs,
//            NUL...), as tests/reference/make_tokenizer_corpus.py writes them.
//   --raw    raw bytes, texts separated by "\n" (a trailing "\n" ends the last text). Each
//            text is decoded from UTF-8 with the WHATWG decoder in replacement mode (every
//            maximal invalid subsequence becomes one U+FFFD, the same as Python's
//            bytes.decode("utf-8", "replace")), since a JavaScript string cannot hold invalid
//            UTF-8. This is the behaviour dhp defines for invalid input, so this mode is
//            how it is tested.
//
// The addon takes JavaScript strings (UTF-16) and hands Rust their UTF-8 form; lines of any
// length work (tested with 1 MB lines). Its `encode` recognises special tokens in the text
// (Tokenizer::encode with encode_special_tokens false), as dhp does.
'use strict';
const fs = require('fs');
const path = require('path');

function loadAddon() {
  const dir = process.env.DHP_HF_ADDON_DIR ||
      path.join(__dirname, '..', '..', '.cache', 'references', 'tokenizers-node');
  return require(path.join(dir, 'tokenizers.node'));
}

function readTexts(file, raw) {
  const buf = fs.readFileSync(file);
  if (raw) {
    const decoder = new TextDecoder('utf-8', {fatal: false, ignoreBOM: true});
    const texts = [];
    let start = 0;
    for (let i = 0; i < buf.length; i++) {
      if (buf[i] === 0x0a) {
        texts.push(decoder.decode(buf.subarray(start, i)));
        start = i + 1;
      }
    }
    if (start < buf.length) texts.push(decoder.decode(buf.subarray(start)));
    return texts;
  }
  const lines = buf.toString('utf8').split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  return lines.map((line, i) => {
    const text = JSON.parse(line);
    if (typeof text !== 'string') throw new Error(`${file}:${i + 1}: not a JSON string`);
    return text;
  });
}

// FNV-1a, 32 bit, of an ASCII string, as 8 hex digits.
function fnv1a32(s) {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h.toString(16).padStart(8, '0');
}

const kBatch = 256;  // texts per encodeBatch call: large enough to amortise the call

async function encodeAll(tok, texts, addSpecial) {
  const ids = [];
  for (let i = 0; i < texts.length; i += kBatch) {
    const encodings = await tok.encodeBatch(texts.slice(i, i + kBatch), {addSpecialTokens: addSpecial});
    for (const e of encodings) ids.push(e.getIds());
  }
  return ids;
}

async function encodeFile(tok, input, out, flags) {
  const texts = readTexts(input, flags.includes('--raw'));
  const ids = await encodeAll(tok, texts, flags.includes('--add-special'));
  const rows = ids.map((row) => row.join(' '));
  const lines = flags.includes('--fnv') ? rows.map(fnv1a32) : rows;
  fs.writeFileSync(out, lines.join('\n') + (lines.length ? '\n' : ''));
}

async function decodeFile(tok, input, out, flags) {
  const rows = fs.readFileSync(input, 'utf8').split('\n');
  if (rows.length && rows[rows.length - 1] === '') rows.pop();
  const ids = rows.map((row) => (row.trim() === '' ? [] : row.trim().split(' ').map(Number)));
  const skip = flags.includes('--skip-special');
  const probe = [];
  if (flags.includes('--probe')) {
    const v = tok.getVocabSize(true);
    probe.push(0, 1, 2, 3, v - 1, v + 5, -1);
    ids.push(probe);
  }
  const texts = [];
  for (let i = 0; i < ids.length; i += kBatch) {
    texts.push(...await tok.decodeBatch(ids.slice(i, i + kBatch), skip));
  }
  const lines = texts.map((t) => JSON.stringify(t));
  if (probe.length) lines.push(JSON.stringify(probe));
  fs.writeFileSync(out, lines.join('\n') + (lines.length ? '\n' : ''));
}

async function runJob(tok, mode, input, out, flags) {
  if (mode === 'encode') {
    await encodeFile(tok, input, out, flags);
  } else if (mode === 'decode') {
    await decodeFile(tok, input, out, flags);
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
}

async function main() {
  const [mode, json, input, out, ...flags] = process.argv.slice(2);
  if (mode === 'batch' && json) {
    const addon = loadAddon();
    const jobs = fs.readFileSync(json, 'utf8').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));
    let loaded = null;
    let tok = null;
    for (const job of jobs) {
      if (job.tokenizer !== loaded) {
        tok = addon.Tokenizer.fromFile(job.tokenizer);
        loaded = job.tokenizer;
      }
      await runJob(tok, job.mode, job.input, job.out, job.flags || []);
    }
    return;
  }
  if (!mode || !json || !input) {
    console.error('usage: hf_tokenize.js encode|decode|time TOKENIZER_JSON INPUT [OUT] [flags]\n' +
                  '       hf_tokenize.js batch JOBS');
    process.exit(2);
  }
  const addon = loadAddon();
  const tok = addon.Tokenizer.fromFile(json);
  if (mode === 'encode' || mode === 'decode') {
    await runJob(tok, mode, input, out, flags);
  } else if (mode === 'time') {
    const args = [out, ...flags].filter((a) => a !== undefined);
    const r = args.indexOf('--repeats');
    const repeats = r >= 0 ? Number(args[r + 1]) : 3;
    const texts = readTexts(input, args.includes('--raw'));
    const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, 'utf8'), 0);
    const seconds = [];
    for (let k = 0; k < repeats; k++) {
      const t0 = process.hrtime.bigint();
      await encodeAll(tok, texts, false);
      seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
    }
    console.log(JSON.stringify({bytes, lines: texts.length, seconds}));
  } else {
    console.error(`hf_tokenize.js: unknown mode ${mode}`);
    process.exit(2);
  }
}

main().catch((e) => {
  console.error(`hf_tokenize.js: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
