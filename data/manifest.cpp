#include "data/manifest.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

#include <algorithm>

#include "core/check.h"
#include "core/json_input.h"
#include "data/tokenizer.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kMarker = "<image>";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}


}  // namespace

// LLaVA-style manifests put a list under "image" too, so both keys take either spelling.
std::vector<std::string> media_list(const json& j, const std::string& kind) {
  const std::string plural = kind + "s";
  const bool one = j.contains(kind), many = j.contains(plural);
  if (one && many)
    throw LineError{"bad format", fmt::format("has both \"{}\" and \"{}\"", kind, plural)};
  std::vector<std::string> out;
  const std::string& key = one ? kind : plural;
  if (one && j[key].is_string()) {
    out.push_back(j[key].get<std::string>());
  } else if (one || many) {
    if (!j[key].is_array())
      throw LineError{"bad format", fmt::format("\"{}\" is neither a string nor an array", key)};
    for (const auto& x : j[key]) {
      if (!x.is_string())
        throw LineError{"bad format", fmt::format("\"{}\" holds a non-string", key)};
      out.push_back(x.get<std::string>());
    }
  }
  for (const auto& p : out)
    if (p.empty()) throw LineError{"bad format", fmt::format("empty {} path", kind)};
  return out;
}

// A relative path must stay inside the image root once "..", "." and symlinks are resolved: a
// manifest from elsewhere must not be able to read (and a build to embed) arbitrary files.
// Absolute paths only when the configuration allows them.
fs::path resolve_media(const std::string& rel, const LineRules& rules, std::string& root_out,
                       const std::string& kind) {
  const std::string bad = "bad " + kind + " path";
  if (rel.find('\0') != std::string::npos)
    throw LineError{bad, "the " + kind + " path holds a NUL character"};
  const fs::path given(rel);
  if (given.is_absolute()) {
    if (!rules.allow_absolute_paths)
      throw LineError{bad,
                      fmt::format("'{}' is absolute; media paths are relative to the image root "
                                  "(set data.allow_absolute_paths = true to allow them)",
                                  rel)};
    return given;
  }
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(fs::absolute(rules.image_root, ec), ec);
  if (ec)
    throw LineError{"unreadable image",
                    fmt::format("image root '{}': {}", rules.image_root.string(), ec.message())};
  const fs::path p = fs::weakly_canonical(root / given, ec);
  if (ec)
    throw LineError{"unreadable image",
                    fmt::format("'{}': {}", (root / given).string(), ec.message())};
  root_out = root.string();
  const auto diverge = std::mismatch(root.begin(), root.end(), p.begin(), p.end()).first;
  if (diverge != root.end())
    throw LineError{bad, fmt::format("'{}' leads outside the image root '{}' (to '{}')", rel,
                                     root.string(), p.string())};
  return p;
}

fs::path manifest_folder(const std::string& manifest) {
  const fs::path parent = fs::path(manifest).parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

std::vector<uint8_t> read_line_image(const ParsedLine& line, size_t k, cv::Mat* bgr) {
  const std::string& path = line.paths[k];
  std::vector<uint8_t> bytes;
  try {
    bytes = read_image_file(path, line.root);
  } catch (const Error& e) {
    throw LineError{"missing image", e.what()};
  }
  cv::Mat decoded;
  try {
    decoded = decode_image(bytes.data(), bytes.size(), path);
  } catch (const Error& e) {
    throw LineError{"corrupt image", e.what()};
  }
  const ImageSize hdr = line.sizes[k];
  if (decoded.rows != hdr.h || decoded.cols != hdr.w)
    throw LineError{"corrupt image", fmt::format("{}: decodes to {}x{}, header says {}x{}", path,
                                                 decoded.rows, decoded.cols, hdr.h, hdr.w)};
  if (bgr) *bgr = std::move(decoded);
  return bytes;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + size_t(n) >= s.size()) return false;  // the sequence is cut short
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += size_t(n) + 1;
  }
  return true;
}

std::string format_counts(const std::map<std::string, int64_t>& counts) {
  std::string out;
  for (const auto& [k, n] : counts) out += fmt::format("{}{}: {}", out.empty() ? "" : ", ", k, n);
  return out;
}

int64_t append_turn(const std::string& value, bool answer, const Tokenizer& tok,
                    int64_t markers_before, std::vector<int32_t>& layout,
                    std::vector<uint8_t>& loss, bool allow_video) {
  int64_t markers = 0;
  size_t at = 0;
  for (;;) {
    const size_t next_image = value.find(kMarker, at);
    const size_t next_video = value.find(kVideoTag, at);
    const size_t next = std::min(next_image, next_video);
    const std::string text =
        trim(value.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (!text.empty()) {
      const auto ids = tok.encode(text);
      layout.insert(layout.end(), ids.begin(), ids.end());
      loss.insert(loss.end(), ids.size(), uint8_t(answer));
    }
    if (next == std::string::npos) break;
    const bool video = next == next_video;
    if (answer)
      throw LineError{"bad format", video ? "a <video> marker in an answer"
                                          : "an <image> marker in an answer"};
    if (video && !allow_video) throw LineError{"bad format", "a <video> marker where only images can go"};
    layout.push_back(video ? kVideoMarker : -int32_t(markers_before + ++markers));
    loss.push_back(0);
    at = next + (video ? kVideoTag.size() : kMarker.size());
  }
  return markers;
}

ParsedLine parse_line(const std::string& line, int64_t line_no, const Tokenizer& tok,
                      const LineRules& rules) {
  // Checked first: nlohmann rejects bad UTF-8 as a parse error, which would hide the cause.
  if (!valid_utf8(line)) throw LineError{"bad utf-8", "the line is not valid UTF-8"};
  json j;
  try {
    j = parse_json_input(line, "the line");
  } catch (const Error& e) {
    throw LineError{"invalid json", e.what()};
  }
  if (j.is_discarded()) throw LineError{"invalid json", "the line is not valid JSON"};
  if (!j.is_object()) throw LineError{"bad format", "the line is not a JSON object"};
  ParsedLine out;
  if (j.contains("id") && j["id"].is_string())
    out.name = j["id"].get<std::string>();
  else if (j.contains("id") && j["id"].is_number())
    out.name = j["id"].dump();
  else
    out.name = "line " + std::to_string(line_no);

  for (const auto& rel : media_list(j, "image")) {
    const fs::path p = resolve_media(rel, rules, out.root, "image");
    std::error_code ec;
    if (!fs::exists(p, ec)) throw LineError{"missing image", p.string()};
    ImageSize s;
    try {
      s = read_image_size(p.string(), out.root);
    } catch (const Error& err) {
      throw LineError{"unreadable image", err.what()};
    }
    if (rules.max_image_pixels > 0 && int64_t(s.h) * s.w > rules.max_image_pixels)
      throw LineError{"image too large",
                      fmt::format("{}: {}x{} pixels > data.max_image_pixels = {}", p.string(),
                                  s.h, s.w, rules.max_image_pixels)};
    out.paths.push_back(p.string());
    out.sizes.push_back(s);
  }

  if (!j.contains("conversations") || !j["conversations"].is_array() ||
      j["conversations"].empty())
    throw LineError{"bad format", "no \"conversations\" array"};
  std::vector<Turn> turns;
  int64_t text_bytes = 0;
  for (const auto& turn : j["conversations"]) {
    if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
        !turn.contains("value") || !turn["value"].is_string())
      throw LineError{"bad format", "a turn lacks a string \"from\" or \"value\""};
    Turn t{turn["from"].get<std::string>(), turn["value"].get<std::string>()};
    // Bounded before tokenizing: SentencePiece takes time quadratic in the length of a run of
    // characters it does not know (and then calls the run one <unk>), so a 30 MB caption would
    // run for hours and then pass as two tokens. No real sample needs more bytes per token.
    text_bytes += int64_t(t.value.size());
    if (text_bytes > kMaxTextBytesPerToken * rules.max_tokens)
      throw LineError{kTooLong, fmt::format("more than {} bytes of text, {} per token of data.max_tokens = {}; "
                                              "refused before tokenizing",
                                              kMaxTextBytesPerToken * rules.max_tokens, kMaxTextBytesPerToken,
                                              rules.max_tokens)};
    if (!t.answer() && t.from != "human" && t.from != "user" && t.from != "system")
      throw LineError{"bad format", "unknown speaker \"" + t.from + "\""};
    turns.push_back(std::move(t));
  }
  const LaidOut laid = layout_conversation(rules.chat, turns, tok, out.layout, out.loss);
  const int64_t markers = laid.markers;
  if (markers != int64_t(out.paths.size()))
    throw LineError{"image count mismatch", fmt::format("{} <image> markers for {} images",
                                                        markers, out.paths.size())};
  if (laid.answer_tokens == 0) throw LineError{"empty text", "no answer text to learn from"};

  std::vector<std::string> videos;
  for (const auto& rel : media_list(j, "video"))
    videos.push_back(resolve_media(rel, rules, out.root, "video").string());
  // A built frame is stored as its tile, which a grid of at least two tiles would cut again;
  // and InternVL's samples hold images or a video, never both (its images share the tiles).
  if (!videos.empty() && rules.vision.tiled() && rules.vision.min_tiles > 1)
    throw LineError{"bad format", fmt::format("a video for a tiled tower with model.vision.min_tiles = {}: its "
                                              "frames are one tile each (set min_tiles = 1)", rules.vision.min_tiles)};
  if (!videos.empty() && !out.paths.empty() && rules.vision.tiled())
    throw LineError{"bad format", "images and a video in one sample for a tiled tower (InternVL's samples hold "
                                  "one or the other: the images share the tiles)"};
  const std::vector<std::string> image_paths = std::move(out.paths);
  const std::vector<ImageSize> image_sizes = std::move(out.sizes);
  place_videos(out, image_paths, image_sizes, videos, tok, rules.vision, rules.video,
               rules.max_image_pixels);

  const int64_t images = int64_t(out.paths.size());  // image files and video frames
  // <bos> (when the tokenizer has one) <eos>, and <img> </img> around each image (all of a
  // tiled image's tiles) when the tokenizer has them.
  out.text_tokens = (tok.ids().has_bos() ? 2 : 1) + int64_t(out.layout.size()) - images +
                    (tok.ids().markers() ? 2 * images : 0);
  const ImageGeometry files = rules.vision.for_images(int64_t(image_paths.size()));
  for (size_t k = 0; k < out.sizes.size(); ++k)
    out.vision_tokens += image_tokens(out.sizes[k].h, out.sizes[k].w,
                                      out.frames[k].index >= 0 ? rules.vision.frame_geometry() : files);
  out.loss_tokens = 1;  // the final <eos>
  for (const uint8_t l : out.loss) out.loss_tokens += l;
  if (out.length() > rules.max_tokens)
    throw LineError{kTooLong, fmt::format("{} tokens > data.max_tokens = {}", out.length(),
                                            rules.max_tokens)};
  return out;
}

}  // namespace dhp
