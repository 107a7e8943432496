// What `dhp data build` writes: shard files of bounded size and one dataset-level index.
//
// shard-NNNNN.h5 (one per slice of the manifest, written whole, then renamed into place):
//   attrs    format = "dhp-shard", version, first_line, end_line (covers manifest lines
//            first_line+1 .. end_line, 1-based, blank lines included)
//   layout       i32 (T)   every sample's ParsedLine::layout, end to end
//   layout_loss  u8  (T)
//   samples      i64 (n, kSampleCols)  see SampleCol
//   images       i64 (m, kImageCols)   see ImageCol; bytes are encoded PNG / JPEG
//   image_bytes  u8  (B)
//   names        u8 (sum of name bytes), name_offsets i64 (n + 1)
//   skipped      u8: JSON [[line, reason, detail], ...] of the lines this shard skipped
// index.h5 (written last; its presence means the build is complete):
//   the samples and images tables of all shards (image rows renumbered globally), the shard
//   of every sample, names, the shards' dataset offsets and file sizes (readers pread the
//   bytes directly), all skipped lines, and the settings the lengths were computed with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "types/image_geometry.h"

namespace dhp {

// Version 2: the stored vision lengths (and the samples filtered as too long) follow the
// resize rule with its final clamp (model-spec.md); version 1 files hold lengths from the rule
// without it, so they are refused rather than read with lengths that no longer match.
// Version 3: the llava_v1 and plain layouts are LLaVA's own ids (the image moved to the front
// of its turn, the caption's "\n", text after an <eos> or a tokenizer's own <image> continued
// as the tokenizer's code continues it): shards of version 2 hold other ids for them.
inline constexpr int64_t kShardFormatVersion = 3;

enum SampleCol : int {
  kLayoutBegin, kLayoutEnd,  // [begin, end) of layout / layout_loss
  kImageBegin, kImageEnd,    // [begin, end) of the images table (global in the index)
  kVision, kText, kLoss,     // length record: vision tokens, text tokens, loss tokens
  kLine,                     // 1-based manifest line
  kTextChecksum,             // fnv1a over the sample's layout then layout_loss bytes
  kSampleCols
};
enum ImageCol : int {
  kByteBegin, kByteEnd,  // [begin, end) of image_bytes
  kHeight, kWidth,       // original size (what the decoded pixels must have)
  kChecksum,             // fnv1a of the encoded bytes
  kImageCols
};
enum ExtentCol : int { kLayoutOffset, kLossOffset, kBytesOffset, kFileSize, kExtentCols };

struct SkipRecord {
  int64_t line = 0;
  std::string reason, detail;
  bool operator==(const SkipRecord&) const = default;
};

struct ShardContents {
  int64_t first_line = 0, end_line = 0;
  std::vector<int32_t> layout;
  std::vector<uint8_t> layout_loss;
  std::vector<int64_t> samples;  // (n, kSampleCols)
  std::vector<int64_t> images;   // (m, kImageCols)
  std::vector<uint8_t> image_bytes;
  std::string names;
  std::vector<int64_t> name_offsets{0};
  std::vector<SkipRecord> skipped;

  int64_t n_samples() const { return int64_t(samples.size()) / kSampleCols; }
  int64_t n_images() const { return int64_t(images.size()) / kImageCols; }
  // What counts against the shard size bound.
  int64_t bytes() const;
};

std::string shard_file_name(int64_t k);  // "shard-00042.h5"

// Writes `path` through a temporary name, fsync and rename: a killed build never leaves a
// half-written shard under the final name.
void write_shard(const std::string& path, const ShardContents& s);
// Everything but layout and image bytes (extent gets their offsets and the file size).
ShardContents read_shard_tables(const std::string& path, std::vector<int64_t>* extent);

struct ShardIndex {
  std::vector<int32_t> shard;    // (n)
  std::vector<int64_t> samples;  // (n, kSampleCols); image columns index `images`
  std::vector<int64_t> images;   // (m, kImageCols)
  std::string names;
  std::vector<int64_t> name_offsets{0};
  std::vector<int64_t> extents;  // (shards, kExtentCols)
  std::vector<SkipRecord> skipped;
  // Settings the lengths were computed and the lines filtered with.
  ImageGeometry vision;
  int64_t max_tokens = 0, max_image_pixels = 0;
  std::string tokenizer_hash;    // Tokenizer::hash() (model file and added tokens), hex
  std::string chat_template = "dhp";  // data.template the layouts were made with (builds from
                                      // before templates existed hold none: "dhp")
  std::string build_key;         // everything the build depended on (build.json)

  int64_t size() const { return int64_t(shard.size()); }
  int64_t n_shards() const { return int64_t(extents.size()) / kExtentCols; }
  int64_t at(int64_t i, SampleCol c) const { return samples[size_t(i * kSampleCols + c)]; }
  int64_t image(int64_t k, ImageCol c) const { return images[size_t(k * kImageCols + c)]; }
  std::string name(int64_t i) const {
    return names.substr(size_t(name_offsets[size_t(i)]),
                        size_t(name_offsets[size_t(i) + 1] - name_offsets[size_t(i)]));
  }
};

inline constexpr const char* kIndexFile = "index.h5";
void write_index(const std::string& dir, const ShardIndex& index);
// Throws dhp::Error when the folder has no complete build or the index is damaged.
ShardIndex read_index(const std::string& dir);

std::string skipped_to_json(const std::vector<SkipRecord>& r);
std::vector<SkipRecord> skipped_from_json(const std::string& s, const std::string& where);

}  // namespace dhp
