#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <unordered_map>

#include "core/check.h"
#include "core/hash.h"
#include "core/input.h"

namespace dhp {

namespace {

// Feeds the in-memory corpus to the trainer, in order, so no temporary file is needed and the
// result does not depend on file-system state.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& texts) : texts_(texts) {}
  bool done() const override { return i_ >= texts_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return texts_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& texts_;
  size_t i_ = 0;
};

}  // namespace

Tokenizer::Tokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_path) {
  // Loaded from the bytes it hashes, so the hash describes exactly the model in use.
  const std::string bytes =
      InputFile("tokenizer", model_path,
                " (set data.tokenizer, or create one with `dhp data synth`)")
          .read_all(kMaxTokenizerBytes, "the size cap of a tokenizer file");
  hash_ = fnv1a(bytes.data(), bytes.size());
  const auto st = sp_->LoadFromSerializedProto(bytes);
  DHP_CHECK(st.ok(), "tokenizer '{}' is not a valid SentencePiece model: {}", model_path,
            st.ToString());
  DHP_CHECK(sp_->pad_id() == kPad && sp_->unk_id() == kUnk && sp_->bos_id() == kBos &&
                sp_->eos_id() == kEos && sp_->PieceToId("<img>") == kImg &&
                sp_->PieceToId("</img>") == kImgEnd,
            "tokenizer '{}' does not reserve the ids dhp needs (pad=0 unk=1 bos=2 eos=3 "
            "<img>=4 </img>=5); train it with `dhp data synth` or train_tokenizer()",
            model_path);
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto st = sp_->Encode(text, &ids);
  DHP_CHECK(st.ok(), "tokenizer '{}': cannot encode text: {}", path_, st.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int n = sp_->GetPieceSize();
  std::vector<int> in;
  in.reserve(ids.size());
  for (int32_t id : ids) in.push_back(id >= 0 && id < n ? id : kUnk);
  std::string text;
  const auto st = sp_->Decode(in, &text);
  DHP_CHECK(st.ok(), "tokenizer '{}': cannot decode ids: {}", path_, st.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

void train_tokenizer(const std::vector<std::string>& texts, int vocab_size,
                     const std::string& model_path) {
  DHP_CHECK(!texts.empty(), "train_tokenizer: no texts to train on");
  DHP_CHECK(vocab_size >= 16, "train_tokenizer: vocab_size {} is too small (>= 16)", vocab_size);
  // BPE rather than unigram: on a small closed vocabulary (the demo's captions) unigram
  // pruning keeps letters and fragments and splits common words; BPE merges them whole.
  // A fixed seed and one thread make the model file reproducible.
  sentencepiece::SetRandomGeneratorSeed(1234);
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},
      {"character_coverage", "1.0"},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"user_defined_symbols", "<img>,</img>"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  VectorIterator it(texts);
  std::string proto;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  DHP_CHECK(st.ok(), "tokenizer training failed: {}", st.ToString());
  {
    std::ofstream out(model_path, std::ios::binary | std::ios::trunc);
    DHP_CHECK(out.good(), "cannot write tokenizer '{}'", model_path);
    out.write(proto.data(), std::streamsize(proto.size()));
    DHP_CHECK(out.good(), "cannot write tokenizer '{}'", model_path);
  }
  // The reserved ids are a contract of the sequence layout: re-read and verify them.
  Tokenizer check(model_path);
}

}  // namespace dhp
