#include "data/shard_dataset.h"

#include <bit>
#include <filesystem>

#include <opencv2/core.hpp>

#include "core/check.h"
#include "core/hash.h"
#include "core/input.h"
#include "core/log.h"
#include "data/config.h"
#include "data/image.h"
#include "data/layout.h"
#include "data/tokenizer.h"
#include "data/video.h"

namespace dhp {

namespace fs = std::filesystem;

// Shards store little-endian integers and are read back as raw bytes.
static_assert(std::endian::native == std::endian::little,
              "ShardDataset reads little-endian shard data in place");

// One open shard file for the duration of a load.
class ShardFile {
 public:
  ShardFile(const std::string& path, int64_t expected_size) : path_(path), file_("shard", path) {
    DHP_CHECK(file_.size() == expected_size,
              "shard '{}' has {} bytes, the index expects {} (truncated or replaced)",
              printable(path), file_.size(), expected_size);
  }
  void read(void* out, int64_t bytes, int64_t offset) const {
    DHP_CHECK(file_.read_at(out, bytes, offset) == bytes,
              "shard '{}': cannot read {} bytes at offset {} (truncated)", printable(path_), bytes,
              offset);
  }

 private:
  std::string path_;
  InputFile file_;
};

namespace {

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

ShardDataset::ShardDataset(const std::string& dir, const Tokenizer& tok, const ImageGeometry& geometry,
                           int64_t max_tokens, const std::string& on_error,
                           int64_t max_image_pixels, ChatTemplate chat)
    : dir_(dir), x_(read_index(dir)), geometry_(geometry), skip_(on_error == "skip") {
  prepare_media_decoding();
  ids_ = tok.ids();
  DHP_CHECK(on_error == "skip" || on_error == "fail",
            "data.on_error must be \"skip\" or \"fail\", not \"{}\"", on_error);
  DHP_CHECK(hex(tok.hash()) == x_.tokenizer_hash,
            "'{}' was built with another tokenizer than '{}' (or other added tokens: {}): the "
            "stored token ids would mean other words; rebuild it or set data.tokenizer (and "
            "data.added_tokens) to what it was built with",
            dir, tok.path(), format_added_tokens(tok.added_tokens()));
  DHP_CHECK(x_.chat_template == template_name(chat),
            "'{}' was built with the chat template '{}', this run's data.template is '{}': the "
            "stored text is laid out for the other; rebuild it or set data.template = \"{}\"",
            dir, x_.chat_template, template_name(chat), x_.chat_template);
  DHP_CHECK(x_.vision.video_frames_per_image == geometry.video_frames_per_image,
            "'{}' was built for a tower that takes {} video frame{} an image, this run's takes {}: its videos "
            "are laid out for the other; rebuild it with this run's model.vision", dir,
            x_.vision.video_frames_per_image, x_.vision.video_frames_per_image > 1 ? "s" : "",
            geometry.video_frames_per_image);
  // A tiled build stores a video's frames as tiles and labels them "Frame{i}: ": laid out for
  // the tiled tower (and an untiled one for the other).
  DHP_CHECK(x_.vision.tiled() == geometry.tiled(),
            "'{}' was built for a tower {} tiles images, this run's {}: its videos are laid out for the other; "
            "rebuild it with this run's model.vision", dir, x_.vision.tiled() ? "that" : "that never",
            geometry.tiled() ? "tiles them (model.vision.max_tiles)" : "does not");
  const bool same_rule = x_.vision.patch == geometry.patch &&
                         x_.vision.merge == geometry.merge &&
                         x_.vision.min_pixels == geometry.min_pixels &&
                         x_.vision.max_pixels == geometry.max_pixels &&
                         x_.vision.resize == geometry.resize &&
                         x_.vision.tiled() == geometry.tiled() &&
                         (!geometry.tiled() || (x_.vision.min_tiles == geometry.min_tiles &&
                                                x_.vision.max_tiles == geometry.max_tiles &&
                                                x_.vision.thumbnail == geometry.thumbnail)) &&
                         (!(geometry.fixed_square() || geometry.tiled()) ||
                          x_.vision.image_size == geometry.image_size);
  const int64_t n_images = int64_t(x_.images.size()) / kImageCols;
  image_grids_.resize(size_t(n_images));
  // A tiled tower's images share the tiles of their sample (ImageGeometry::for_images).
  for (int64_t row = 0; row < x_.size(); ++row) {
    const int64_t b = x_.at(row, kImageBegin), e = x_.at(row, kImageEnd);  // in range (read_index)
    const ImageGeometry g = geometry.for_images(e - b);
    for (int64_t k = b; k < e; ++k)
      image_grids_[size_t(k)] = image_grid(int(x_.image(k, kHeight)), int(x_.image(k, kWidth)), g);
  }
  for (const auto& r : x_.skipped) ++skipped_[r.reason];
  int64_t filtered = 0;
  for (int64_t row = 0; row < x_.size(); ++row) {
    int64_t vision = 0;
    bool too_large = false;
    for (int64_t k = x_.at(row, kImageBegin); k < x_.at(row, kImageEnd); ++k) {
      DHP_CHECK(k >= 0 && k < n_images, "'{}': damaged index (image row {})", dir, k);
      vision += image_grids_[size_t(k)].tokens();
      too_large |= max_image_pixels > 0 &&
                   x_.image(k, kHeight) * x_.image(k, kWidth) > max_image_pixels;
    }
    DHP_CHECK(!same_rule || vision == x_.at(row, kVision),
              "'{}': damaged index (sample {} records {} vision tokens, its images give {})", dir,
              row, x_.at(row, kVision), vision);
    const int64_t length = vision + x_.at(row, kText);
    const char* reason = too_large ? "image too large" : length > max_tokens ? kTooLong : nullptr;
    if (reason) {
      DHP_CHECK(skip_, "'{}': sample '{}' (manifest line {}): {} for this run (set "
                "data.on_error = \"skip\" to leave such samples out)",
                dir, x_.name(row), x_.at(row, kLine), reason);
      ++skipped_[reason];
      ++filtered;
      continue;
    }
    rows_.push_back(row);
    vision_.push_back(vision);
    names_.push_back(x_.name(row));
  }
  if (filtered > 0)
    spdlog::warn("{}: left out {} of {} built samples over this run's limits", dir, filtered,
                 x_.size());
  if (!same_rule)
    spdlog::info("{}: vision tokens recomputed for this model's resize rule", dir);
  DHP_CHECK(size() > 0, "'{}' holds no usable sample", dir);
}

int64_t ShardDataset::length(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return vision_[size_t(i)] + x_.at(rows_[size_t(i)], kText);
}

int64_t ShardDataset::vision_tokens(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return vision_[size_t(i)];
}

int32_t ShardDataset::images(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return int32_t(x_.at(rows_[size_t(i)], kImageEnd) - x_.at(rows_[size_t(i)], kImageBegin));
}

int32_t ShardDataset::tower_images(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  int32_t n = 0;
  for (int64_t k = x_.at(rows_[size_t(i)], kImageBegin); k < x_.at(rows_[size_t(i)], kImageEnd); ++k)
    n += encoder_images(image_grids_[size_t(k)], geometry_);
  return n;
}

int64_t ShardDataset::loss_tokens(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return x_.at(rows_[size_t(i)], kLoss);
}

const std::string& ShardDataset::name(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return names_[size_t(i)];
}

std::string ShardDataset::shard_path(int64_t i) const {
  return (fs::path(dir_) / shard_file_name(x_.shard[size_t(rows_[size_t(i)])])).string();
}

void ShardDataset::read_text(int64_t i, const ShardFile& f, Text& out) const {
  const int64_t row = rows_[size_t(i)];
  const int64_t* ext = &x_.extents[size_t(x_.shard[size_t(row)] * kExtentCols)];
  const int64_t lb = x_.at(row, kLayoutBegin), n = x_.at(row, kLayoutEnd) - lb;
  out.layout.resize(size_t(n));
  out.loss.resize(size_t(n));
  if (n > 0) {
    f.read(out.layout.data(), n * 4, ext[kLayoutOffset] + lb * 4);
    f.read(out.loss.data(), n, ext[kLossOffset] + lb);
  }
  uint64_t sum = fnv1a(out.layout.data(), out.layout.size() * sizeof(int32_t));
  sum = fnv1a(out.loss.data(), out.loss.size(), sum);
  DHP_CHECK(int64_t(sum) == x_.at(row, kTextChecksum),
            "shard '{}': the text of manifest line {} fails its checksum (damaged shard)",
            shard_path(i), x_.at(row, kLine));
  const int64_t ib = x_.at(row, kImageBegin), n_img = x_.at(row, kImageEnd) - ib;
  out.view.layout = out.layout.data();
  out.view.loss = out.loss.data();
  out.view.n = n;
  out.view.image_grids.assign(image_grids_.begin() + ib, image_grids_.begin() + ib + n_img);
  out.view.ids = ids_;
  const int64_t L_stored = full_length(out.view);
  DHP_CHECK(L_stored == length(i), "shard '{}': manifest line {} lays out {} tokens, the index says {}",
            shard_path(i), x_.at(row, kLine), L_stored, length(i));
}

std::vector<ImageSpan> ShardDataset::image_spans(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  if (images(i) == 0) return {};
  std::vector<ImageSpan> spans;
  // Under the on_error policy of load_range: a sample whose text went bad loads as a
  // placeholder, so it has no image tokens to place.
  const Sample s = guarded_load(i, 0, 0, skip_, [&] {
    const int64_t shard = x_.shard[size_t(rows_[size_t(i)])];
    const ShardFile f(shard_path(i), x_.extents[size_t(shard * kExtentCols + kFileSize)]);
    Text text;
    read_text(i, f, text);
    spans = dhp::image_spans(text.view);
    return Sample{};
  });
  return s.skipped ? std::vector<ImageSpan>{} : spans;
}

Sample ShardDataset::load_range(int64_t i, int64_t begin, int64_t end, ImageLoad images) const {
  DHP_ASSERT(i >= 0 && i < size());
  const int64_t L = length(i);
  DHP_CHECK(begin >= 0 && begin <= end && end <= L,
            "token range [{}, {}) is outside sample {}'s {} tokens", begin, end, i, L);
  return guarded_load(i, begin, end, skip_, [&] {
    const int64_t row = rows_[size_t(i)];
    const int64_t shard = x_.shard[size_t(row)];
    const int64_t* ext = &x_.extents[size_t(shard * kExtentCols)];
    const std::string path = shard_path(i);
    const ShardFile f(path, ext[kFileSize]);
    Text text;
    read_text(i, f, text);
    const int64_t ib = x_.at(row, kImageBegin);
    auto decode = [&](int64_t k) {
      const int64_t g = ib + k;
      const int64_t a = x_.image(g, kByteBegin), b = x_.image(g, kByteEnd);
      const std::string what = fmt::format("{} (line {}, image {})", path, x_.at(row, kLine), k);
      DHP_CHECK(a >= 0 && b >= a && ext[kBytesOffset] + b <= ext[kFileSize],
                "image '{}': damaged index (bytes {}..{})", what, a, b);
      std::vector<uint8_t> bytes(size_t(b - a));
      f.read(bytes.data(), b - a, ext[kBytesOffset] + a);
      DHP_CHECK(int64_t(fnv1a(bytes.data(), bytes.size())) == x_.image(g, kChecksum),
                "image '{}' fails its checksum (damaged shard)", what);
      const cv::Mat bgr = decode_image(bytes.data(), bytes.size(), what);
      const ImageSize size{int(x_.image(g, kHeight)), int(x_.image(g, kWidth))};
      // A video's frame pair was stored as one picture, the second frame below the first.
      if (bgr.rows == 2 * size.h && bgr.cols == size.w && x_.vision.video_frames_per_image == 2) {
        PreparedImage im = prepare_checked(bgr.rowRange(0, size.h), size, what, geometry_);
        const PreparedImage b = prepare_checked(bgr.rowRange(size.h, 2 * size.h), size, what, geometry_);
        im.pixels.insert(im.pixels.end(), b.pixels.begin(), b.pixels.end());
        im.frames = 2;
        return im;
      }
      return prepare_checked(bgr, size, what, geometry_.for_images(x_.at(row, kImageEnd) - ib));
    };
    return expand_layout(text.view, begin, end, decode, geometry_.merge, images,
                         geometry_.mean_rgb());
  });
}

}  // namespace dhp
