// Decoders of tokenizer.json (decoders/* of Hugging Face `tokenizers`): ByteLevel Metaspace
// ByteFallback Fuse Strip Replace BPEDecoder Sequence. Each rewrites the list of token
// strings; decode joins what the last one leaves.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/hf/json_fields.h"

namespace dhp::hf {

struct Scratch;

struct Decoder {
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens, Scratch& sc) const = 0;
};

// Appends the decoders of `j` (the "decoder" object, not null) to `out`; an unsupported type
// or option is a dhp::Error naming `w`.
void parse_decoder(const json& j, const Where& w, std::vector<std::unique_ptr<Decoder>>& out);

}  // namespace dhp::hf
