#include "data/shard_format.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "core/check.h"
#include "core/hash.h"
#include "core/json_input.h"
#include "data/shard_io.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;
constexpr const char* kShardFormat = "dhp-shard";
constexpr const char* kIndexFormat = "dhp-shard-index";

void check_format(H5Reader& r, const char* want, const std::string& path) {
  DHP_CHECK(r.attr_str("format") == want, "'{}' is not a {} file (rebuild it with `dhp data build`)",
            path, want);
  const int64_t version = r.attr_i64("version");
  DHP_CHECK(version == kShardFormatVersion,
            "'{}' has format version {}, this dhp reads version {}{}: rebuild the folder with "
            "`dhp data build` (into a new --out folder, or after deleting the old one)",
            path, version, kShardFormatVersion,
            version < kShardFormatVersion
                ? " (its image token counts come from the resize rule before the max_pixels "
                  "clamp)"
                : "");
  r.format_is_known();
}

}  // namespace

int64_t ShardContents::bytes() const {
  return int64_t(image_bytes.size() + layout.size() * 5 + names.size() +
                 (samples.size() + images.size() + name_offsets.size()) * 8);
}

std::string shard_file_name(int64_t k) { return fmt::format("shard-{:05d}.h5", k); }

std::string skipped_to_json(const std::vector<SkipRecord>& r) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : r) j.push_back({s.line, s.reason, s.detail});
  // Details may quote bytes of a bad line: replace invalid UTF-8 rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<SkipRecord> skipped_from_json(const std::string& s, const std::string& where) {
  const auto j = parse_json_input(s, "'" + where + "': the list of skipped lines");
  DHP_CHECK(j.is_array(), "'{}': damaged list of skipped lines", where);
  std::vector<SkipRecord> out;
  for (const auto& e : j) {
    DHP_CHECK(e.is_array() && e.size() == 3 && e[0].is_number_integer() && e[1].is_string() &&
                  e[2].is_string(),
              "'{}': damaged list of skipped lines", where);
    out.push_back({e[0].get<int64_t>(), e[1].get<std::string>(), e[2].get<std::string>()});
  }
  return out;
}

// The checksum of a shard's tables. Texts and images carry their own per sample; the tables
// are read only when a build resumes, and must not pass damaged numbers into the index.
int64_t tables_checksum(const ShardContents& s, const std::string& skipped_json) {
  uint64_t h = fnv1a(&s.first_line, sizeof s.first_line);
  h = fnv1a(&s.end_line, sizeof s.end_line, h);
  for (const auto* v : {&s.samples, &s.images, &s.name_offsets})
    h = fnv1a(v->data(), v->size() * sizeof(int64_t), h);
  h = fnv1a(s.names.data(), s.names.size(), h);
  h = fnv1a(skipped_json.data(), skipped_json.size(), h);
  return int64_t(h);
}

void write_shard(const std::string& path, const ShardContents& s) {
  const std::string tmp = path + ".tmp";
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Writer w(tmp);
    w.attr("format", std::string(kShardFormat));
    w.attr("version", kShardFormatVersion);
    w.attr("first_line", s.first_line);
    w.attr("end_line", s.end_line);
    w.i32("layout", s.layout);
    w.u8("layout_loss", s.layout_loss);
    w.i64("samples", s.samples, kSampleCols);
    w.i64("images", s.images, kImageCols);
    w.u8("image_bytes", s.image_bytes);
    w.text("names", s.names);
    w.i64("name_offsets", s.name_offsets);
    const std::string skipped = skipped_to_json(s.skipped);
    w.text("skipped", skipped);
    w.attr("tables_checksum", tables_checksum(s, skipped));
    w.close();
  }
  commit_rename(tmp, path);
}

ShardContents read_shard_tables(const std::string& path, std::vector<int64_t>* extent) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  H5Reader r(path);
  check_format(r, kShardFormat, path);
  ShardContents s;
  s.first_line = r.attr_i64("first_line");
  s.end_line = r.attr_i64("end_line");
  s.samples = r.i64("samples", kSampleCols);
  s.images = r.i64("images", kImageCols);
  s.names = r.text("names");
  s.name_offsets = r.i64("name_offsets");
  const std::string skipped = r.text("skipped");
  // Shards built before the checksum existed are read unchecked.
  if (r.has_attr("tables_checksum"))
    DHP_CHECK(r.attr_i64("tables_checksum") == tables_checksum(s, skipped),
              "'{}' is damaged: its tables do not match their checksum; rebuild it", path);
  s.skipped = skipped_from_json(skipped, path);
  DHP_CHECK(int64_t(s.name_offsets.size()) == s.n_samples() + 1, "'{}': damaged name table",
            path);
  if (extent) {
    extent->assign(kExtentCols, -1);
    (*extent)[kLayoutOffset] = r.extent("layout").offset;
    (*extent)[kLossOffset] = r.extent("layout_loss").offset;
    (*extent)[kBytesOffset] = r.extent("image_bytes").offset;
    (*extent)[kFileSize] = int64_t(fs::file_size(path));
  }
  return s;
}

void write_index(const std::string& dir, const ShardIndex& x) {
  const std::string path = (fs::path(dir) / kIndexFile).string();
  const std::string tmp = path + ".tmp";
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Writer w(tmp, Seal::whole_file);
    w.attr("format", std::string(kIndexFormat));
    w.attr("version", kShardFormatVersion);
    w.attr("patch", int64_t(x.vision.patch));
    w.attr("merge", int64_t(x.vision.merge));
    w.attr("min_pixels", x.vision.min_pixels);
    w.attr("max_pixels", x.vision.max_pixels);
    w.attr("pad_square", int64_t(x.vision.resize == ImageFit::pad_square ? x.vision.image_size : 0));
    w.attr("resize", std::string(image_fit_name(x.vision.resize)));
    w.attr("image_size", int64_t(x.vision.image_size));
    // Builds for a tower of one frame an image record nothing (as those made before pairs).
    if (x.vision.video_frames_per_image != 1)
      w.attr("video_frames_per_image", int64_t(x.vision.video_frames_per_image));
    // Tiled builds record their tiling (the vision tokens depend on it); others nothing.
    if (x.vision.tiled()) {
      w.attr("min_tiles", int64_t(x.vision.min_tiles));
      w.attr("max_tiles", int64_t(x.vision.max_tiles));
      w.attr("thumbnail", int64_t(x.vision.thumbnail));
    }
    w.attr("max_tokens", x.max_tokens);
    w.attr("max_image_pixels", x.max_image_pixels);
    w.attr("tokenizer_hash", x.tokenizer_hash);
    w.attr("chat_template", x.chat_template);
    w.attr("build_key", x.build_key);
    w.i32("shard", x.shard);
    w.i64("samples", x.samples, kSampleCols);
    w.i64("images", x.images, kImageCols);
    w.text("names", x.names);
    w.i64("name_offsets", x.name_offsets);
    w.i64("extents", x.extents, kExtentCols);
    w.text("skipped", skipped_to_json(x.skipped));
    w.close();
  }
  commit_rename(tmp, path);
}

ShardIndex read_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / kIndexFile).string();
  DHP_CHECK(fs::exists(path),
            "'{}' holds no complete build (no {}): run or finish `dhp data build --out {}`", dir,
            kIndexFile, dir);
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  H5Reader r(path);
  check_format(r, kIndexFormat, path);
  ShardIndex x;
  x.vision.patch = int(r.attr_i64("patch"));
  x.vision.merge = int(r.attr_i64("merge"));
  x.vision.min_pixels = r.attr_i64("min_pixels");
  x.vision.max_pixels = r.attr_i64("max_pixels");
  // Builds made before the processors' modes record only pad_square's side; those made before
  // pad_square existed resized natively.
  if (r.has_attr("resize")) {
    const std::string mode = r.attr_str("resize");
    bool known = false;
    for (const auto& [fit, name] : kImageFitNames)
      if (name == mode) x.vision.resize = fit, known = true;
    DHP_CHECK(known, "'{}': images resized by \"{}\", which this dhp does not know", path, mode);
    x.vision.image_size = int(r.attr_i64("image_size"));
  } else if (r.has_attr("pad_square") && r.attr_i64("pad_square") > 0) {
    x.vision.resize = ImageFit::pad_square;
    x.vision.image_size = int(r.attr_i64("pad_square"));
  }
  if (r.has_attr("video_frames_per_image"))
    x.vision.video_frames_per_image = int(r.attr_i64("video_frames_per_image"));
  x.vision.max_tiles = 0;
  if (r.has_attr("max_tiles")) {
    x.vision.min_tiles = int(r.attr_i64("min_tiles"));
    x.vision.max_tiles = int(r.attr_i64("max_tiles"));
    x.vision.thumbnail = r.attr_i64("thumbnail") != 0;
  }
  x.max_tokens = r.attr_i64("max_tokens");
  x.max_image_pixels = r.attr_i64("max_image_pixels");
  x.tokenizer_hash = r.attr_str("tokenizer_hash");
  if (r.has_attr("chat_template")) x.chat_template = r.attr_str("chat_template");
  x.build_key = r.attr_str("build_key");
  x.shard = r.i32("shard");
  x.samples = r.i64("samples", kSampleCols);
  x.images = r.i64("images", kImageCols);
  x.names = r.text("names");
  x.name_offsets = r.i64("name_offsets");
  x.extents = r.i64("extents", kExtentCols);
  x.skipped = skipped_from_json(r.text("skipped"), path);
  const int64_t n = x.size();
  DHP_CHECK(int64_t(x.samples.size()) == n * kSampleCols &&
                int64_t(x.name_offsets.size()) == n + 1,
            "'{}': the index tables disagree in length (damaged file)", path);
  // Every reference must land inside its table: a damaged index must not read out of bounds.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = x.at(i, kImageBegin), e = x.at(i, kImageEnd);
    DHP_CHECK(x.shard[size_t(i)] >= 0 && x.shard[size_t(i)] < x.n_shards() && b >= 0 && b <= e &&
                  e <= int64_t(x.images.size()) / kImageCols &&
                  x.name_offsets[size_t(i)] <= x.name_offsets[size_t(i) + 1] &&
                  x.name_offsets[size_t(i) + 1] <= int64_t(x.names.size()),
              "'{}': sample {} points outside the index tables (damaged file)", path, i);
  }
  return x;
}

}  // namespace dhp
