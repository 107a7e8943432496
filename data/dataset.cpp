#include "data/dataset.h"

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include <filesystem>
#include <fstream>

#include "data/tokenizer.h"
#include "kernels/check.h"
#include "kernels/log.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kMaxWarnings = 20;  // after this many, only the summary line reports skips
const std::string kMarker = "<image>";

// A manifest line that cannot be used; reason is the counting key, detail the specifics.
struct LineError {
  std::string reason, detail;
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> image_list(const json& j) {
  const bool one = j.contains("image"), many = j.contains("images");
  if (one && many) throw LineError{"bad format", "has both \"image\" and \"images\""};
  std::vector<std::string> out;
  if (one) {
    if (!j["image"].is_string()) throw LineError{"bad format", "\"image\" is not a string"};
    out.push_back(j["image"].get<std::string>());
  } else if (many) {
    if (!j["images"].is_array()) throw LineError{"bad format", "\"images\" is not an array"};
    for (const auto& x : j["images"]) {
      if (!x.is_string()) throw LineError{"bad format", "\"images\" holds a non-string"};
      out.push_back(x.get<std::string>());
    }
  }
  for (const auto& p : out)
    if (p.empty()) throw LineError{"bad format", "empty image path"};
  return out;
}

}  // namespace

JsonlDataset::JsonlDataset(const std::string& manifest, const std::string& image_root,
                           const Tokenizer& tok, const ModelConfig& model, int64_t max_tokens,
                           const std::string& on_error)
    : model_(model) {
  DHP_CHECK(on_error == "skip" || on_error == "fail",
            "data.on_error must be \"skip\" or \"fail\", not \"{}\"", on_error);
  std::ifstream in(manifest);
  DHP_CHECK(in.good(), "manifest '{}' not found or not readable (set data.train / data.val)",
            manifest);
  const fs::path root =
      image_root.empty() ? fs::path(manifest).parent_path() : fs::path(image_root);
  std::string line;
  int64_t line_no = 0, n_skipped = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (trim(line).empty()) continue;
    // Built locally and appended only when the whole line is good.
    std::vector<int32_t> layout;
    std::vector<uint8_t> loss;
    std::vector<std::string> paths;
    std::vector<ImageSize> sizes;
    Entry e;
    try {
      const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) throw LineError{"invalid json", "the line is not valid JSON"};
      if (!j.is_object()) throw LineError{"bad format", "the line is not a JSON object"};
      if (j.contains("id") && j["id"].is_string())
        e.name = j["id"].get<std::string>();
      else if (j.contains("id") && j["id"].is_number())
        e.name = j["id"].dump();
      else
        e.name = "line " + std::to_string(line_no);

      for (const auto& rel : image_list(j)) {
        const fs::path p = fs::path(rel).is_absolute() ? fs::path(rel) : root / rel;
        if (!fs::exists(p)) throw LineError{"missing image", p.string()};
        try {
          sizes.push_back(read_image_size(p.string()));
        } catch (const Error& err) {
          throw LineError{"unreadable image", err.what()};
        }
        paths.push_back(p.string());
      }

      if (!j.contains("conversations") || !j["conversations"].is_array() ||
          j["conversations"].empty())
        throw LineError{"bad format", "no \"conversations\" array"};
      int64_t markers = 0, answer_tokens = 0;
      for (const auto& turn : j["conversations"]) {
        if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
            !turn.contains("value") || !turn["value"].is_string())
          throw LineError{"bad format", "a turn lacks a string \"from\" or \"value\""};
        const std::string from = turn["from"].get<std::string>();
        const bool answer = from == "gpt" || from == "assistant";
        if (!answer && from != "human" && from != "user" && from != "system")
          throw LineError{"bad format", "unknown speaker \"" + from + "\""};
        const std::string value = turn["value"].get<std::string>();
        size_t at = 0;
        for (;;) {
          const size_t next = value.find(kMarker, at);
          const std::string text = trim(value.substr(at, next == std::string::npos
                                                              ? std::string::npos
                                                              : next - at));
          if (!text.empty()) {
            const auto ids = tok.encode(text);
            layout.insert(layout.end(), ids.begin(), ids.end());
            loss.insert(loss.end(), ids.size(), uint8_t(answer));
            if (answer) answer_tokens += int64_t(ids.size());
          }
          if (next == std::string::npos) break;
          if (answer) throw LineError{"bad format", "an <image> marker in an answer"};
          layout.push_back(-int32_t(++markers));
          loss.push_back(0);
          at = next + kMarker.size();
        }
      }
      if (markers != int64_t(paths.size()))
        throw LineError{"image count mismatch",
                        std::to_string(markers) + " <image> markers for " +
                            std::to_string(paths.size()) + " images"};
      if (answer_tokens == 0) throw LineError{"empty text", "no answer text to learn from"};

      e.length = 2 + int64_t(layout.size()) - markers;  // <bos>, <eos>, text
      for (const auto& s : sizes) e.length += 2 + image_tokens(s.h, s.w, model.vision);
      e.loss_tokens = answer_tokens + 1;
      if (e.length > max_tokens)
        throw LineError{"too long", std::to_string(e.length) + " tokens > data.max_tokens = " +
                                        std::to_string(max_tokens)};
    } catch (const LineError& err) {
      DHP_CHECK(on_error == "skip",
                "{}:{}: {}: {} (set data.on_error = \"skip\" to skip such lines)", manifest,
                line_no, err.reason, err.detail);
      ++skipped_[err.reason];
      if (++n_skipped <= kMaxWarnings)
        spdlog::warn("{}:{}: skipped ({}): {}", manifest, line_no, err.reason, err.detail);
      continue;
    }
    e.layout_begin = int64_t(layout_.size());
    layout_.insert(layout_.end(), layout.begin(), layout.end());
    layout_loss_.insert(layout_loss_.end(), loss.begin(), loss.end());
    e.layout_end = int64_t(layout_.size());
    e.image_begin = int64_t(image_paths_.size());
    image_paths_.insert(image_paths_.end(), paths.begin(), paths.end());
    image_sizes_.insert(image_sizes_.end(), sizes.begin(), sizes.end());
    e.image_end = int64_t(image_paths_.size());
    entries_.push_back(std::move(e));
  }
  if (n_skipped > 0) {
    std::string by;
    for (const auto& [reason, n] : skipped_)
      by += fmt::format("{}{}: {}", by.empty() ? "" : ", ", reason, n);
    spdlog::warn("{}: skipped {} of {} lines ({})", manifest, n_skipped,
                 n_skipped + size(), by);
  }
  DHP_CHECK(size() > 0, "manifest '{}' holds no usable sample", manifest);
}

int64_t JsonlDataset::length(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return entries_[size_t(i)].length;
}

int64_t JsonlDataset::loss_tokens(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return entries_[size_t(i)].loss_tokens;
}

const std::string& JsonlDataset::name(int64_t i) const {
  DHP_ASSERT(i >= 0 && i < size());
  return entries_[size_t(i)].name;
}

Sample JsonlDataset::load(int64_t i, bool blank_images) const {
  DHP_ASSERT(i >= 0 && i < size());
  const Entry& e = entries_[size_t(i)];
  const int m = model_.vision.merge;
  Sample s;
  s.id = i;
  for (int64_t k = e.image_begin; k < e.image_end; ++k) {
    const std::string& path = image_paths_[size_t(k)];
    const cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
    DHP_CHECK(!bgr.empty(), "image '{}' cannot be decoded", path);
    const ImageSize hdr = image_sizes_[size_t(k)];
    DHP_CHECK(bgr.rows == hdr.h && bgr.cols == hdr.w,
              "image '{}' decodes to {}x{} but its header says {}x{}", path, bgr.rows,
              bgr.cols, hdr.h, hdr.w);
    s.images.push_back(prepare_image(bgr, model_.vision));
    if (blank_images) blank(s.images.back());
  }
  const size_t cap = size_t(e.length);
  s.tokens.reserve(cap);
  s.loss_mask.reserve(cap);
  s.image_of.reserve(cap);
  auto push = [&](int32_t tok, uint8_t loss, int32_t img) {
    s.tokens.push_back(tok);
    s.loss_mask.push_back(loss);
    s.image_of.push_back(img);
  };
  push(Tokenizer::kBos, 0, -1);
  for (int64_t t = e.layout_begin; t < e.layout_end; ++t) {
    const int32_t v = layout_[size_t(t)];
    if (v >= 0) {
      push(v, layout_loss_[size_t(t)], -1);
      continue;
    }
    const int32_t k = -v - 1;
    const PreparedImage& im = s.images[size_t(k)];
    // Counted from the decoded grid, so the check below compares against the header path.
    const int64_t n = int64_t(im.grid_h / m) * (im.grid_w / m);
    push(Tokenizer::kImg, 0, -1);
    for (int64_t j = 0; j < n; ++j) push(Tokenizer::kPad, 0, k);
    push(Tokenizer::kImgEnd, 0, -1);
  }
  push(Tokenizer::kEos, 1, -1);
  DHP_ASSERT(int64_t(s.tokens.size()) == e.length);
  return s;
}

}  // namespace dhp
