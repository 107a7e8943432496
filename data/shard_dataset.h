// A folder built by `dhp data build`, read through the Dataset interface. Opening reads only
// index.h5: every sample's lengths, shard and byte offsets, so any rank finds any sample in
// O(1) and plans without touching a shard. Loading preads the sample's layout and just the
// image blobs its token range needs (no HDF5 call, so loader threads never serialise), checks
// their checksums and decodes them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/shard_format.h"

namespace dhp {

class ShardFile;  // one open shard, for the duration of a load

class ShardDataset final : public Dataset {
 public:
  // Throws dhp::Error when the folder holds no complete build, or when `tokenizer` is not the
  // model file it was built with (the stored token ids would mean other words). Vision
  // tokens are recomputed from the stored image sizes with `model`'s resize rule, so a
  // different [geometry] needs no rebuild. Samples over max_tokens, or with an image
  // over max_image_pixels, are skipped and counted. `chat` must be the template it was built
  // with (the stored layout holds that template's text).
  ShardDataset(const std::string& dir, const Tokenizer& tokenizer, const ImageGeometry& geometry,
               int64_t max_tokens, const std::string& on_error,
               int64_t max_image_pixels = kDefaultMaxImagePixels,
               ChatTemplate chat = ChatTemplate::Dhp);

  int64_t size() const override { return int64_t(rows_.size()); }
  int64_t length(int64_t i) const override;
  int64_t vision_tokens(int64_t i) const override;
  int32_t images(int64_t i) const override;
  int32_t tower_images(int64_t i) const override;
  int64_t loss_tokens(int64_t i) const override;
  const std::string& name(int64_t i) const override;
  // The build's skipped lines by reason, plus the samples this open filtered out.
  const std::map<std::string, int64_t>& skipped() const override { return skipped_; }
  using Dataset::load_range;
  Sample load_range(int64_t i, int64_t begin, int64_t end, ImageLoad images) const override;
  std::vector<ImageSpan> image_spans(int64_t i) const override;

  const ShardIndex& index() const { return x_; }
  int64_t index_row(int64_t i) const { return rows_[size_t(i)]; }

 private:
  // Sample i's stored text, checked against its checksum and its indexed length.
  struct Text {
    std::vector<int32_t> layout;
    std::vector<uint8_t> loss;
    StoredLayout view;  // points into layout and loss
  };
  std::string shard_path(int64_t i) const;
  void read_text(int64_t i, const ShardFile& f, Text& out) const;

  std::string dir_;
  ShardIndex x_;
  ImageGeometry geometry_;
  bool skip_ = true;
  std::vector<int64_t> rows_;          // (size) index row of each usable sample
  std::vector<int64_t> vision_;        // (size) vision tokens under geometry_
  std::vector<MergedGrid> image_grids_;  // (images of the index) merged tokens per image
  std::vector<std::string> names_;     // (size)
  std::map<std::string, int64_t> skipped_;
};

}  // namespace dhp
