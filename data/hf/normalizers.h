// Normalizers of tokenizer.json (normalizers/* of Hugging Face `tokenizers`): NFC NFD NFKC
// NFKD Lowercase Replace Prepend Strip StripAccents Nmt Sequence. Each rewrites a piece of
// text in place; a Sequence is read as the list of its members.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/hf/json_fields.h"

namespace dhp::hf {

struct Scratch;

struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s, Scratch& sc) const = 0;
};

// Appends the normalizers of `j` (the "normalizer" object, null for none) to `out`; an
// unsupported type or option is a dhp::Error naming `w`.
void parse_normalizer(const json& j, const Where& w, std::vector<std::unique_ptr<Normalizer>>& out);

// The Replace normalizer of `j` ({"pattern": ..., "content": ...}); the Replace decoder
// applies the same to each token.
std::unique_ptr<Normalizer> make_replace(const json& j, const Where& w);

}  // namespace dhp::hf
