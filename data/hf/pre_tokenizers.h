// Pre-tokenizers of tokenizer.json (pre_tokenizers/* of Hugging Face `tokenizers`): Split
// ByteLevel Metaspace Digits Whitespace WhitespaceSplit Punctuation BertPreTokenizer
// CharDelimiterSplit Sequence. They form a chain of stages run depth-first: each stage cuts
// (and may rewrite) a piece and hands its pieces to the next; the last hands words to the
// model. Also GPT-2's byte alphabet and Metaspace's prepend scheme, which the decoders share.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/hf/json_fields.h"

namespace dhp::hf {

struct Scratch;
class Pipeline;

struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  // `at_origin`: the piece starts at offset 0 of the original text (Metaspace's "first").
  virtual void run(std::string_view piece, bool at_origin, size_t stage, Pipeline& p) const = 0;
  virtual bool transforms() const { return false; }
};

// One run of the stages over the pieces of one text.
class Pipeline {
 public:
  // `word` receives the pieces that come out of the last stage.
  Pipeline(const std::vector<std::unique_ptr<PreTokenizer>>& stages, Scratch& sc,
           const std::function<void(std::string_view)>& word);
  // Hands `piece` to stage `stage` (the words' receiver after the last); empty pieces vanish.
  void emit(size_t stage, std::string_view piece, bool at_origin) {
    if (piece.empty()) return;
    if (stage == stages_.size()) {
      word_(piece);
    } else {
      stages_[stage]->run(piece, at_origin, stage, *this);
    }
  }
  Scratch& scratch() { return sc_; }

 private:
  const std::vector<std::unique_ptr<PreTokenizer>>& stages_;
  Scratch& sc_;
  const std::function<void(std::string_view)>& word_;
};

// Appends the stages of `j` (the "pre_tokenizer" object, null for none) to `out`; an
// unsupported type or option is a dhp::Error naming `w`.
void parse_pre_tokenizer(const json& j, const Where& w, std::vector<std::unique_ptr<PreTokenizer>>& out);

enum class PrependScheme { kFirst, kNever, kAlways };

// Metaspace's prepend_scheme (with the older add_prefix_space), for the pre-tokenizer and the
// decoder.
PrependScheme parse_prepend_scheme(const json& j, const Where& w);

// A Metaspace stage whose prepend_scheme is "first".
bool is_metaspace_first(const PreTokenizer& p);

// Byte-level alphabet (GPT-2's bytes_to_unicode).
struct ByteAlphabet {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> char_to_byte;  // code point -> byte, -1 outside the alphabet
  static const ByteAlphabet& get();

 private:
  ByteAlphabet();
};

}  // namespace dhp::hf
