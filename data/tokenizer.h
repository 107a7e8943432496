// SentencePiece tokenizer with the reserved ids of model-spec.md's sequence layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dhp {

// Largest tokenizer file read: SentencePiece models are a few MB; the cap keeps a wrong path
// (a disk image, a log) from being read whole into memory.
inline constexpr int64_t kMaxTokenizerBytes = int64_t(256) << 20;

class Tokenizer {
 public:
  static constexpr int32_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3, kImg = 4, kImgEnd = 5;

  // Throws dhp::Error when the file is missing, not a regular file, over kMaxTokenizerBytes,
  // not a SentencePiece model, or does not reserve the ids above.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Thread-safe (SentencePiece's encode/decode are const).
  std::vector<int32_t> encode(const std::string& text) const;
  // Ids outside the vocabulary (a model may have a larger output layer) decode as <unk>.
  std::string decode(const std::vector<int32_t>& ids) const;
  int vocab_size() const;
  const std::string& path() const { return path_; }
  // FNV-1a of the model file's bytes: checkpoints record it to detect a replaced tokenizer.
  uint64_t hash() const { return hash_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_;
  uint64_t hash_ = 0;
};

// Trains a BPE model on `texts` and writes it to model_path, reserving the ids above (a
// small corpus still works: hard_vocab_limit is off). Deterministic for the same inputs.
void train_tokenizer(const std::vector<std::string>& texts, int vocab_size,
                     const std::string& model_path);

}  // namespace dhp
