#include "data/dataset.h"

#include <opencv2/core.hpp>

#include <filesystem>

#include "core/check.h"
#include "core/hash.h"
#include "core/input.h"
#include "core/log.h"
#include "data/layout.h"
#include "data/manifest_reader.h"
#include "data/tokenizer.h"
#include "data/video.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;

constexpr int kMaxWarnings = 20;  // after this many, only the summary line reports skips

bool blank_line(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

}  // namespace

Sample Dataset::guarded_load(int64_t i, int64_t begin, int64_t end, bool skip,
                             const std::function<Sample()>& load) const {
  try {
    Sample s = load();
    s.id = i;
    return s;
  } catch (const Error& e) {
    if (!skip)
      throw Error(fmt::format("sample {} ('{}'): {} (set data.on_error = \"skip\" to train on "
                              "without it)",
                              i, name(i), e.what()));
    // Few enough that every one is worth a line: data going bad after indexing is rare.
    spdlog::warn("sample {} ('{}') skipped: {}", i, name(i), e.what());
    ++bad_loads_;
    return placeholder_sample(i, begin, end, length(i), ids_.pad);
  }
}

JsonlDataset::JsonlDataset(const std::string& manifest, const std::string& image_root,
                           const Tokenizer& tok, const ImageGeometry& geometry, int64_t max_tokens,
                           const std::string& on_error, int64_t max_image_pixels,
                           bool allow_absolute_paths, const volatile int* stop,
                           ChatTemplate chat, const VideoRules& video)
    : geometry_(geometry), skip_(on_error == "skip") {
  prepare_media_decoding();
  ids_ = tok.ids();
  DHP_CHECK(on_error == "skip" || on_error == "fail",
            "data.on_error must be \"skip\" or \"fail\", not \"{}\"", on_error);
  DHP_CHECK(!fs::is_directory(manifest),
            "manifest '{}' is a folder, not a JSONL file (nor a folder built by `dhp data build`)",
            printable(manifest));
  ManifestReader in(manifest, " (set data.train / data.val)", stop);
  LineRules rules;
  rules.image_root = image_root.empty() ? manifest_folder(manifest) : fs::path(image_root);
  rules.allow_absolute_paths = allow_absolute_paths;
  rules.vision = geometry;
  rules.max_tokens = max_tokens;
  rules.max_image_pixels = max_image_pixels;
  rules.chat = chat;
  rules.video = video;
  std::string line;
  int64_t n_skipped = 0;
  while (in.next(line)) {
    const int64_t line_no = in.record_no();
    if (blank_line(line)) continue;
    ParsedLine p;
    try {
      p = parse_line(line, line_no, tok, rules);
      // Decoded once here, as `dhp data build` does, so both paths accept the same lines; the
      // bytes go into the fingerprint ranks compare (a node's stale copy of an image folder).
      uint64_t h = media_hash_;
      for (size_t k = 0; k < p.paths.size(); ++k)
        if (p.frames[k].index < 0) {
          const std::vector<uint8_t> bytes = read_line_image(p, k, nullptr);
          h = fnv1a(bytes.data(), bytes.size(), h);
        } else if (k == 0 || p.paths[k] != p.paths[k - 1]) {  // a clip's frames: the clip once
          const uint64_t clip = video_file_hash(p.paths[k], p.root);
          h = fnv1a(&clip, sizeof clip, h);
        }
      check_line_frames(p, nullptr);
      media_hash_ = h;
    } catch (const LineError& err) {
      DHP_CHECK(on_error == "skip", "{}: {}: {} (set data.on_error = \"skip\" to skip such lines)",
                in.where(line_no), err.reason, err.detail);
      ++skipped_[err.reason];
      if (++n_skipped <= kMaxWarnings)
        spdlog::warn("{}: skipped ({}): {}", in.where(line_no), err.reason, err.detail);
      continue;
    }
    Entry e;
    e.name = std::move(p.name);
    e.length = p.length();
    e.vision_tokens = p.vision_tokens;
    e.loss_tokens = p.loss_tokens;
    e.layout_begin = int64_t(layout_.size());
    layout_.insert(layout_.end(), p.layout.begin(), p.layout.end());
    layout_loss_.insert(layout_loss_.end(), p.loss.begin(), p.loss.end());
    e.layout_end = int64_t(layout_.size());
    e.image_begin = int64_t(image_paths_.size());
    image_root_ = p.root;
    int64_t files = 0;
    for (const FrameRef& f : p.frames) files += f.index < 0;
    const ImageGeometry tiled = geometry.for_images(files);
    for (size_t k = 0; k < p.paths.size(); ++k) {
      image_paths_.push_back(p.paths[k]);
      image_sizes_.push_back(p.sizes[k]);
      image_frames_.push_back(p.frames[k]);
      image_grids_.push_back(
          image_grid(p.sizes[k].h, p.sizes[k].w, p.frames[k].index >= 0 ? geometry.frame_geometry() : tiled));
    }
    e.image_end = int64_t(image_paths_.size());
    entries_.push_back(std::move(e));
  }
  if (n_skipped > 0)
    spdlog::warn("{}: skipped {} of {} {} ({})", manifest, n_skipped, n_skipped + size(), in.is_array() ? "records" : "lines",
                 format_counts(skipped_));
  DHP_CHECK(size() > 0, "manifest '{}' holds no usable sample", manifest);
}

std::string JsonlDataset::contents_fingerprint() const { return fmt::format("{:016x}", media_hash_); }

int64_t JsonlDataset::length(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return entries_[size_t(i)].length;
}

int64_t JsonlDataset::vision_tokens(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return entries_[size_t(i)].vision_tokens;
}

int32_t JsonlDataset::images(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return int32_t(entries_[size_t(i)].image_end - entries_[size_t(i)].image_begin);
}

int32_t JsonlDataset::tower_images(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  const Entry& e = entries_[size_t(i)];
  int32_t n = 0;
  for (int64_t k = e.image_begin; k < e.image_end; ++k) n += encoder_images(image_grids_[size_t(k)], geometry_);
  return n;
}

int64_t JsonlDataset::loss_tokens(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return entries_[size_t(i)].loss_tokens;
}

const std::string& JsonlDataset::name(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return entries_[size_t(i)].name;
}

StoredLayout JsonlDataset::stored_layout(int64_t i) const {
  const Entry& e = entries_[size_t(i)];
  StoredLayout s;
  s.layout = layout_.data() + e.layout_begin;
  s.loss = layout_loss_.data() + e.layout_begin;
  s.n = e.layout_end - e.layout_begin;
  s.image_grids.assign(image_grids_.begin() + e.image_begin, image_grids_.begin() + e.image_end);
  s.ids = ids_;
  return s;
}

std::vector<ImageSpan> JsonlDataset::image_spans(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return dhp::image_spans(stored_layout(i));
}

Sample JsonlDataset::load_range(int64_t i, int64_t begin, int64_t end, ImageLoad images) const {
  DHP_ASSERT(i >= 0 && i < size());
  const Entry& e = entries_[size_t(i)];
  DHP_CHECK(begin >= 0 && begin <= end && end <= e.length,
            "token range [{}, {}) is outside sample {}'s {} tokens", begin, end, i, e.length);
  int64_t n_files = 0;
  for (int64_t k = e.image_begin; k < e.image_end; ++k) n_files += image_frames_[size_t(k)].index < 0;
  const ImageGeometry files = geometry_.for_images(n_files);
  return guarded_load(i, begin, end, skip_, [&] {
    FrameReader frames(image_root_);  // one open clip per load, read forward
    auto decode = [&](int64_t k) {
      const std::string& path = image_paths_[size_t(e.image_begin + k)];
      const FrameRef& ref = image_frames_[size_t(e.image_begin + k)];
      if (ref.index >= 0) {
        const ImageSize size = image_sizes_[size_t(e.image_begin + k)];
        auto read = [&](const FrameRef& f) {
          try {
            return prepare_checked(frames.read(path, f, size), size, path, geometry_.frame_geometry());
          } catch (const LineError& err) {
            throw Error(fmt::format("{}: {}", err.reason, err.detail));
          }
        };
        PreparedImage im = read(ref);
        if (ref.pair >= 0) {  // a frame pair: the second frame's patches after the first's
          // An odd count's last frame is paired with itself: its pixels again, not a seek back.
          const std::vector<uint8_t> first = im.pixels;
          const std::vector<uint8_t> second = ref.pair == ref.index ? first : read(second_frame(ref)).pixels;
          im.pixels.insert(im.pixels.end(), second.begin(), second.end());
          im.frames = 2;
        }
        return im;
      }
      const std::vector<uint8_t> bytes = read_image_file(path, image_root_);
      const cv::Mat bgr = decode_image(bytes.data(), bytes.size(), path);
      return prepare_checked(bgr, image_sizes_[size_t(e.image_begin + k)], path, files);
    };
    return expand_layout(stored_layout(i), begin, end, decode, geometry_.merge, images,
                         geometry_.mean_rgb());
  });
}

}  // namespace dhp
