// A byte-level / SentencePiece-style BPE tokenizer read from a Hugging Face `tokenizer.json`,
// producing exactly the ids of Hugging Face's Rust `tokenizers` (0.22), as checked by
// tests/test_hf_tokenizer.cpp against the library itself on the real files of Qwen3,
// Llama-3.1, Llama-3, DeepSeek-V3, Gemma-3 and Llama-2.
//
// Pipeline (the library's order): added tokens with normalized=false are cut out of the raw
// text (leftmost-longest, lstrip/rstrip/single_word as the library applies them); every other
// piece is normalized, then added tokens with normalized=true are cut out of it; what remains
// is pre-tokenized into words, and each word goes through the BPE model; the post-processor
// adds its special tokens when add_special_tokens is true.
//
// Supported components (anything else is refused at load with a dhp::Error naming the file
// and the JSON key):
//   normalizers     NFC NFD NFKC NFKD Lowercase Replace Prepend Strip StripAccents Nmt Sequence
//   pre-tokenizers  Split ByteLevel Metaspace Digits Whitespace WhitespaceSplit Punctuation
//                   BertPreTokenizer CharDelimiterSplit Sequence
//   model           BPE (both merges formats, ignore_merges, byte_fallback, unk_token,
//                   fuse_unk, continuing_subword_prefix, end_of_word_suffix; dropout null/0)
//   post-processors TemplateProcessing ByteLevel Sequence
//   decoders        ByteLevel Metaspace ByteFallback Fuse Strip Replace BPEDecoder Sequence
// Split/Replace regexes are Oniguruma patterns (what the library compiles); they are
// translated to PCRE2 with Oniguruma's meaning of \s (Unicode White_Space) and \p{..} (general
// categories only). Constructs whose meaning differs between the two engines (\w \b \h, ^ $,
// POSIX brackets, (?m), \p{C} ...) are refused.
//
// Each part of the library carries its own Unicode version, and so does each part here (all
// checked against the library on every code point): regex classes 16.0 (Oniguruma); NFC, NFD,
// NFKC, NFKD and StripAccents 9.0 (unicode-normalization-alignments); Lowercase and Digits
// 17.0 (Rust's char methods); Punctuation 8.0 (unicode_categories); the added tokens'
// single_word and the Whitespace pre-tokenizer 16.0 (the regex crate). ICU 72 (Unicode 15)
// supplies the data, with tables for what 16.0 and 17.0 added.
//
// Invalid UTF-8 in the text given to encode: every maximal invalid subsequence is replaced by
// U+FFFD before anything else, exactly as Python's bytes.decode("utf-8", "replace") and the
// WHATWG decoder do (the library itself only accepts valid UTF-8).
//
// decode returns what the library's decode returns: ids unknown to the tokenizer are skipped,
// special tokens too when skip_special_tokens; then the decoder (tokens joined by " " when the
// file has none). For byte-level files decode(encode(x)) is x after the normalizer (NFC for
// Qwen3) with invalid UTF-8 replaced.
//
// Thread safety: a loaded tokenizer is immutable; encode and decode may be called from any
// number of threads at once. Each concurrent call borrows a scratch object (PCRE2 match state,
// buffers, a cache of up to 16k words: about 2 MB) from a pool guarded by a mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dhp {

// Largest tokenizer.json read: the real files are up to ~35 MB (Gemma-3: 33 MB, 262k vocab
// and 515k merges); the cap keeps a wrong path (a checkpoint, a disk image) from being parsed.
inline constexpr int64_t kMaxHfTokenizerJsonBytes = int64_t(64) << 20;
// Deepest JSON nesting accepted (real files nest about 6 levels).
inline constexpr int kMaxHfTokenizerJsonDepth = 64;

// One entry of tokenizer.json's "added_tokens".
struct HfAddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
  bool operator==(const HfAddedToken&) const = default;
};

class HfTokenizer {
 public:
  // Reads and validates `json_path`. Throws dhp::Error naming the file and the JSON key for a
  // missing or oversized file, malformed JSON, nesting deeper than kMaxHfTokenizerJsonDepth,
  // an unsupported component or option, merges naming unknown tokens, an added token whose id
  // is not the one the library would give it, and the like.
  static std::unique_ptr<HfTokenizer> load(const std::string& json_path);
  // The same from the file's text; `name` stands for the file in messages.
  static std::unique_ptr<HfTokenizer> from_json(std::string_view json_text, const std::string& name);
  ~HfTokenizer();
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  // Special tokens in the text are always recognised (as the library's encode does).
  // at_start false: the text continues a longer one after a special token (Metaspace's
  // prepend_scheme "first" then prepends nothing), as the library treats the pieces between
  // the added tokens it cuts out.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens, bool at_start = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  // The token string of an id (an added token's content first, else the model's token);
  // empty when the id is unknown.
  std::string id_to_token(int32_t id) const;
  // -1 when `token` is neither an added token nor in the model's vocabulary.
  int32_t token_to_id(std::string_view token) const;
  // Largest id + 1 over the model's vocabulary and the added tokens.
  int32_t vocab_size() const;
  // In the file's order.
  const std::vector<HfAddedToken>& added_tokens() const;
  // What the post-processor puts before and after the ids when add_special_tokens is true
  // (e.g. Llama-3: prefix {128000}, suffix {}); both empty when it adds nothing.
  const std::vector<int32_t>& special_prefix() const;
  const std::vector<int32_t>& special_suffix() const;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dhp
