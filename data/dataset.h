// The data set interface, and LLaVA-style JSONL manifests (the small-data path): one sample
// per line,
//   {"id": "...", "image": "images/a.png" | "images": [...], "conversations":
//    [{"from": "human", "value": "<image>\nDescribe the image."}, {"from": "gpt", "value": "..."}]}
// A `<image>` marker in a human turn places the next image there; a sample may have none.
// "video" / "videos" with `<video>` markers add video clips, laid out as frames
// (data/video.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/layout.h"
#include "data/manifest.h"
#include "data/sample.h"
#include "types/image_geometry.h"

namespace dhp {

class Tokenizer;

// What training and evaluation need of a data set: every sample's lengths without decoding
// anything, and the decoded sample, or a token range of it, on demand. JSONL manifests
// (JsonlDataset) and built HDF5 shards (ShardDataset) implement it.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t length(int64_t i) const = 0;          // decoder tokens of sample i
  virtual int64_t vision_tokens(int64_t i) const = 0;   // of which image tokens
  virtual int32_t images(int64_t i) const = 0;          // images those tokens come from
  virtual int32_t tower_images(int64_t i) const = 0;    // the tower's images they make (an
                                                        // image's tiles each count)
  virtual int64_t loss_tokens(int64_t i) const = 0;     // tokens with loss_mask = 1
  virtual const std::string& name(int64_t i) const = 0; // a name for messages
  virtual const std::map<std::string, int64_t>& skipped() const = 0;  // bad samples by reason

  // Tokens [begin, end) of sample i, decoding only the images whose tokens overlap the range;
  // equal to slice_sample(load(i), begin, end). When the sample's data went bad after
  // indexing (a vanished or corrupt image, a damaged shard) it throws dhp::Error naming the
  // sample in on_error = "fail" mode, and in "skip" mode warns and returns
  // placeholder_sample(). Thread-safe: the loader's workers call it concurrently.
  virtual Sample load_range(int64_t i, int64_t begin, int64_t end, ImageLoad images) const = 0;
  Sample load_range(int64_t i, int64_t begin, int64_t end, bool blank_images) const {
    return load_range(i, begin, end, blank_images ? ImageLoad::Blank : ImageLoad::Decode);
  }
  Sample load(int64_t i, bool blank_images) const {
    return load_range(i, 0, length(i), blank_images);
  }
  // Where sample i's images lie (image order), without decoding any. Reads the sample's text
  // where the index does not hold it (shards); when that text went bad it returns no spans in
  // on_error = "skip" mode (every load of the sample then gives a placeholder, which has no
  // image tokens either) and throws in "fail" mode.
  virtual std::vector<ImageSpan> image_spans(int64_t i) const = 0;
  // Loads that came back as placeholders (skip mode).
  int64_t bad_loads() const { return bad_loads_.load(); }
  // A hash of what the set reads besides its own file, for ranks to compare: the bytes of a
  // manifest's images and clips; "" where the set's own file already holds everything (built
  // shards: the index records every sample's checksums).
  virtual std::string contents_fingerprint() const { return ""; }

 protected:
  // The tokenizer's special ids: what the layout expands to and what placeholders hold.
  SpecialIds ids_;

  // Runs `load` under the on_error policy, as load_range promises.
  Sample guarded_load(int64_t i, int64_t begin, int64_t end, bool skip,
                      const std::function<Sample()>& load) const;

 private:
  mutable std::atomic<int64_t> bad_loads_{0};
};

class JsonlDataset final : public Dataset {
 public:
  // Parses the whole manifest and predicts every sample's length from image headers alone.
  // image_root "" = the manifest's folder. on_error: "skip" (warn, count, go on) | "fail".
  // max_image_pixels: an image with more pixels (by its header) is skipped; 0 = no limit.
  // Every image is decoded once here, so a line is usable exactly when `dhp data build` would
  // store it. allow_absolute_paths: accept absolute image paths (else "bad image path").
  // The manifest must be a regular file with lines of at most kMaxLineBytes; loading stops
  // with an error once *stop is non-zero (the trainer's SIGTERM flag). `chat` lays out the
  // turns (data/chat_template.h).
  JsonlDataset(const std::string& manifest, const std::string& image_root,
               const Tokenizer& tokenizer, const ImageGeometry& geometry, int64_t max_tokens,
               const std::string& on_error, int64_t max_image_pixels = kDefaultMaxImagePixels,
               bool allow_absolute_paths = false, const volatile int* stop = nullptr,
               ChatTemplate chat = ChatTemplate::Dhp, const VideoRules& video = VideoRules());

  int64_t size() const override { return int64_t(entries_.size()); }
  int64_t length(int64_t i) const override;
  int64_t vision_tokens(int64_t i) const override;
  int32_t images(int64_t i) const override;
  int32_t tower_images(int64_t i) const override;
  int64_t loss_tokens(int64_t i) const override;
  const std::string& name(int64_t i) const override;  // the manifest's "id" (or "line N")
  // Skipped lines by reason ("invalid json", "missing image", ...: see manifest.h).
  const std::map<std::string, int64_t>& skipped() const override { return skipped_; }
  using Dataset::load_range;
  Sample load_range(int64_t i, int64_t begin, int64_t end, ImageLoad images) const override;
  std::vector<ImageSpan> image_spans(int64_t i) const override;

  // FNV-1a over the bytes of every usable line's images and clips, in manifest order.
  std::string contents_fingerprint() const override;

 private:
  StoredLayout stored_layout(int64_t i) const;
  struct Entry {
    std::string name;
    int64_t layout_begin = 0, layout_end = 0;  // range of layout_/layout_loss_
    int64_t image_begin = 0, image_end = 0;    // range of image_paths_/image_grids_
    int64_t length = 0;
    int64_t vision_tokens = 0;
    int64_t loss_tokens = 0;
  };
  // Every sample's ParsedLine::layout, end to end.
  std::vector<int32_t> layout_;        // (sum of text tokens + images)
  std::vector<uint8_t> layout_loss_;   // (same)
  std::vector<std::string> image_paths_;
  std::string image_root_;              // resolved: every load stays inside it
  std::vector<ImageSize> image_sizes_;  // header sizes, checked against the decoded pixels
  std::vector<FrameRef> image_frames_;  // which video frame an image is (index -1: a file)
  std::vector<MergedGrid> image_grids_;  // predicted from the header sizes
  std::vector<Entry> entries_;
  std::map<std::string, int64_t> skipped_;
  ImageGeometry geometry_;
  bool skip_ = true;
  uint64_t media_hash_ = 0;  // contents_fingerprint()
};

struct DataConfig;

// Opens `path` by what it is: a folder built by `dhp data build` (it holds index.h5) as a
// ShardDataset, anything else as a JSONL manifest. Limits and on_error come from `data`;
// reading a manifest stops with an error once *stop is non-zero.
std::unique_ptr<Dataset> open_dataset(const std::string& path, const DataConfig& data,
                                      const Tokenizer& tokenizer, const ImageGeometry& geometry,
                                      const volatile int* stop = nullptr);

}  // namespace dhp
