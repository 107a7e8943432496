// LLaVA-style JSONL manifests: one sample per line,
//   {"id": "...", "image": "images/a.png" | "images": [...], "conversations":
//    [{"from": "human", "value": "<image>\nDescribe the image."}, {"from": "gpt", "value": "..."}]}
// A `<image>` marker in a human turn places the next image there; a sample may have none.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/image.h"
#include "model/config.h"

namespace dhp {

class Tokenizer;

// One document in model-spec.md's layout:
//   <bos> human text ... <img> [image tokens] </img> ... gpt answer <eos>
struct Sample {
  int64_t id = 0;                      // dataset index
  std::vector<int32_t> tokens;         // (L) token ids; image tokens hold Tokenizer::kPad
  std::vector<uint8_t> loss_mask;      // (L) 1 on answer tokens and the final <eos>
  std::vector<int32_t> image_of;       // (L) image index for image tokens, -1 on text
  std::vector<PreparedImage> images;   // in order of appearance
};

// What training and evaluation need of a data set: every sample's lengths without decoding
// anything, and the decoded sample on demand. JSONL manifests implement it here; other
// storage (HDF5 shards) implements the same interface.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t length(int64_t i) const = 0;          // decoder tokens of sample i
  virtual int64_t loss_tokens(int64_t i) const = 0;     // tokens with loss_mask = 1
  virtual const std::string& name(int64_t i) const = 0; // a name for messages
  virtual const std::map<std::string, int64_t>& skipped() const = 0;  // bad samples by reason
  // Thread-safe: the loader's workers call it concurrently.
  virtual Sample load(int64_t i, bool blank_images) const = 0;
};

class JsonlDataset final : public Dataset {
 public:
  // Parses the whole manifest and predicts every sample's length from image headers alone.
  // image_root "" = the manifest's folder. on_error: "skip" (warn, count, go on) | "fail".
  JsonlDataset(const std::string& manifest, const std::string& image_root,
               const Tokenizer& tokenizer, const ModelConfig& model, int64_t max_tokens,
               const std::string& on_error);

  int64_t size() const override { return int64_t(entries_.size()); }
  int64_t length(int64_t i) const override;
  int64_t loss_tokens(int64_t i) const override;
  const std::string& name(int64_t i) const override;  // the manifest's "id" (or "line N")
  // Skipped lines by reason ("invalid json", "missing image", ...).
  const std::map<std::string, int64_t>& skipped() const override { return skipped_; }

  // Decodes the images (or blanks them) and lays out the document. Thread-safe.
  Sample load(int64_t i, bool blank_images) const override;

 private:
  struct Entry {
    std::string name;
    int64_t layout_begin = 0, layout_end = 0;  // range of layout_/layout_loss_
    int64_t image_begin = 0, image_end = 0;    // range of image_paths_/image_sizes_
    int64_t length = 0;
    int64_t loss_tokens = 0;
  };
  // Tokens of all samples with each image as one placeholder -(k+1) standing for
  // <img> [tokens of image k] </img>; expanded by load().
  std::vector<int32_t> layout_;        // (sum of text tokens + images)
  std::vector<uint8_t> layout_loss_;   // (same)
  std::vector<std::string> image_paths_;
  std::vector<ImageSize> image_sizes_;  // header sizes, for the prediction check in load()
  std::vector<Entry> entries_;
  std::map<std::string, int64_t> skipped_;
  ModelConfig model_;
};

}  // namespace dhp
