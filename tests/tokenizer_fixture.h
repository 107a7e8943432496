// Tokenizers for the tests of the special-id table and the chat templates, trained here from a
// fixed corpus (deterministic: one thread, a fixed seed):
//   - a Llama-2-style SentencePiece model: BPE, unk 0, bos 1, eos 2, no pad, byte fallback,
//     the identity normalizer with a dummy prefix and no whitespace folding (as Llama's
//     tokenizer.model has), so it encodes text as a pretrained checkpoint's model does;
//   - dhp's own (train_tokenizer), on the same corpus.
// docs/data.md quotes the ids these give; tests/test_tokenizer.cpp checks them.
#pragma once

#include <sentencepiece_trainer.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"

namespace dhp {

inline std::vector<std::string> fixture_corpus() {
  std::vector<std::string> texts = {
      std::string(kVicunaSystem),
      "USER: What is in the image? ASSISTANT: A red circle.",
      "USER: What color is it? ASSISTANT: It is red.",
      "USER: Describe the image. ASSISTANT: A blue square at the top left.",
      "a red circle and a blue square",
      "what is the shape at the top left of the image",
  };
  // Repeated so that the merges the examples use are frequent enough to be learned.
  std::vector<std::string> out;
  for (int r = 0; r < 8; ++r) out.insert(out.end(), texts.begin(), texts.end());
  return out;
}

class FixtureCorpus : public sentencepiece::SentenceIterator {
 public:
  bool done() const override { return i_ >= texts_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return texts_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> texts_ = fixture_corpus();
  size_t i_ = 0;
};

// Writes a Llama-style model (see above) with `vocab_size` pieces at most to `path`.
inline void train_llama_style_tokenizer(const std::string& path, int vocab_size = 1000) {
  sentencepiece::SetRandomGeneratorSeed(1234);
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  FixtureCorpus corpus;
  std::string proto;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &corpus, &proto);
  DHP_CHECK(st.ok(), "training the Llama-style fixture tokenizer failed: {}", st.ToString());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(proto.data(), std::streamsize(proto.size()));
  DHP_CHECK(out.good(), "cannot write '{}'", path);
}

inline void train_dhp_fixture_tokenizer(const std::string& path) {
  train_tokenizer(fixture_corpus(), 200, path);
}

// Conversations on which dhp's llava_v1/vicuna_v1/plain layouts are compared with LLaVA's own
// code (tests/reference/llava_ids.py) and llava-hf's tokenizer: an image before its text,
// after it, in a later round, a turn holding only the image, none; plain captions.
struct LlavaRecord {
  bool has_image = true;
  std::vector<Turn> turns;
};
inline std::vector<LlavaRecord> llava_v1_records() {
  return {
      {true, {{"human", "<image>\nWhat is in the image?"}, {"gpt", "A red circle."}}},
      {true,
       {{"human", "What color is it? <image>"}, {"gpt", "It is red."},
        {"human", "Describe the image."}, {"gpt", "A blue square at the top left."}}},
      {true,
       {{"human", "what is the shape"}, {"gpt", "a red circle and a blue square"},
        {"human", "  What is at the top <image> left of the image?  "}, {"gpt", "A blue square."},
        {"human", "And the color?"}, {"gpt", "It is red."}}},
      {true, {{"human", "<image>"}, {"gpt", "A red circle and a blue square."}}},
      {false,
       {{"human", "What color is it?"}, {"gpt", "It is red."}, {"human", "Describe the image."},
        {"gpt", "A blue square."}}},
  };
}
inline std::vector<LlavaRecord> plain_records() {
  return {
      {true, {{"human", "<image>\nDescribe the image."}, {"gpt", "a red circle and a blue square"}}},
      {true, {{"human", "Describe. <image>"}, {"gpt", "A blue square at the top left."}}},
  };
}
// One JSON object a line: {"has_image": ..., "conversations": [{"from", "value"}, ...]}.
inline std::string llava_records_jsonl(const std::vector<LlavaRecord>& records) {
  std::string out;
  for (const LlavaRecord& r : records) {
    nlohmann::json turns = nlohmann::json::array();
    for (const Turn& t : r.turns) turns.push_back({{"from", t.from}, {"value", t.value}});
    out += nlohmann::json{{"has_image", r.has_image}, {"conversations", turns}}.dump() + "\n";
  }
  return out;
}
// A stored layout as LLaVA's input_ids and labels: <bos>, each image as `image_id`, the
// closing <eos> when `closing_eos` (LLaVA's plain prompt has none), targets where the loss is.
inline std::pair<std::vector<int32_t>, std::vector<int32_t>> as_llava_ids(
    const std::vector<int32_t>& layout, const std::vector<uint8_t>& loss, const SpecialIds& ids,
    int32_t image_id, bool closing_eos) {
  std::vector<int32_t> input = {ids.bos}, labels = {-100};
  for (size_t k = 0; k < layout.size(); ++k) {
    input.push_back(layout[k] < 0 ? image_id : layout[k]);
    labels.push_back(loss[k] ? layout[k] : -100);
  }
  if (closing_eos) input.push_back(ids.eos), labels.push_back(ids.eos);
  return {input, labels};
}

}  // namespace dhp
