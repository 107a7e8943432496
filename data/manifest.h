// One line of a LLaVA-style JSONL manifest, checked and tokenized. Shared by JsonlDataset
// (the small-data path) and `dhp data build`, so both accept and reject exactly the same
// lines and lay out exactly the same tokens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_template.h"
#include "data/image.h"
#include "data/video.h"
#include "types/image_geometry.h"

namespace dhp {

class Tokenizer;

// A sample that cannot be used. `reason` is the counting key of the build report and of
// Dataset::skipped(); `detail` says what exactly is wrong. Reasons, all stable strings:
//   "invalid json", "bad utf-8", "bad format", "bad image path", "missing image",
//   "unreadable image", "corrupt image", "image too large", "empty text",
//   "image count mismatch", "too long"; for videos (data/video.h) "bad video path",
//   "missing video", "unreadable video", "corrupt video", "truncated video",
//   "video too large", "video count mismatch".
// A sample over data.max_tokens: skipped by a limit the user set, not for bad data (so
// data.max_skipped leaves it out).
inline constexpr const char* kTooLong = "too long";

struct LineError {
  std::string reason, detail;
};

// The paths of a line's "KIND" or "KINDs" entry (kind = "image" or "video"), in order, none
// when absent: a string or an array of strings under either key, never both keys. Throws
// LineError ("bad format").
std::vector<std::string> media_list(const nlohmann::json& line, const std::string& kind);

// What decides whether a line is usable and how long it is.
// A sample's text may hold at most this many bytes per token of data.max_tokens: real text
// averages 2-5 bytes per token, and what is far beyond it (a megabyte of one character the
// tokenizer does not know) is refused as "too long" before the tokenizer sees it.
inline constexpr int64_t kMaxTextBytesPerToken = 64;

struct LineRules {
  std::filesystem::path image_root;  // relative image paths are resolved against it and must
                                     // stay inside it (no "..", no symlink out of it)
  bool allow_absolute_paths = false; // accept absolute image paths as they are
  ImageGeometry vision;               // the resize rule that gives vision tokens
  int64_t max_tokens = 4096;         // longer samples are "too long"
  int64_t max_image_pixels = 0;      // H*W above it is "image too large"; 0 = no limit
  ChatTemplate chat = ChatTemplate::Dhp;  // how the turns are laid out (data.template)
  VideoRules video;                  // frame sampling and pixel budget of "video" entries
};

struct ParsedLine {
  std::string name;                 // the "id" field, or "line N"
  // Text tokens with each image as one placeholder -(k+1), standing for the tokens of image k
  // (between <img> and </img> when the tokenizer has markers); <bos> and the final <eos> are
  // not stored.
  std::vector<int32_t> layout;
  std::vector<uint8_t> loss;        // (layout) 1 on answer tokens
  std::vector<std::string> paths;   // resolved image paths
  std::string root;                 // the image root, resolved: paths inside it are read
                                    // without leaving it (core/input.h)
  std::vector<ImageSize> sizes;     // header sizes; a video frame's stored size
  std::vector<FrameRef> frames;     // per image: which video frame it is (index -1: a file)
  int64_t vision_tokens = 0;        // image tokens of all images
  int64_t text_tokens = 0;          // every other decoder token: <bos>, <eos>, markers
  int64_t loss_tokens = 0;          // answer tokens and the final <eos>
  int64_t length() const { return vision_tokens + text_tokens; }
};

// Parses, validates (UTF-8, JSON shape, image paths, headers and pixel limit, markers, token
// budget) and tokenizes one line. Throws LineError. Reads image headers and video containers,
// never pixels; each video's frames become images in layout order (data/video.h).
ParsedLine parse_line(const std::string& line, int64_t line_no, const Tokenizer& tok,
                      const LineRules& rules);

// Reads and decodes image k of a parsed line and checks the pixels against its header. Both
// data paths (JsonlDataset when it opens a manifest, `dhp data build` before it stores a
// line) call it, so they accept exactly the same lines. Returns the file's bytes; `bgr`, when
// given, receives the decoded pixels. Throws LineError ("missing image", "corrupt image").
std::vector<uint8_t> read_line_image(const ParsedLine& line, size_t k, cv::Mat* bgr);

// The folder a manifest's relative image paths start from when no image root is given: the
// manifest's own folder ("." for a bare file name).
std::filesystem::path manifest_folder(const std::string& manifest);

// Appends one conversation turn in the training layout: the trimmed text between <image>
// markers tokenized, each marker as the next image placeholder -(markers_before + k + 1);
// a <video> marker becomes kVideoMarker (parse_line expands it into frames) and does not
// count; with allow_video = false (`dhp generate`) it is refused.
// loss gets `answer` for every text token. Returns the number of markers; throws LineError
// for a marker in an answer. The dhp chat template (chat_template.h) is this, turn by turn.
int64_t append_turn(const std::string& value, bool answer, const Tokenizer& tok,
                    int64_t markers_before, std::vector<int32_t>& layout,
                    std::vector<uint8_t>& loss, bool allow_video = false);

bool valid_utf8(std::string_view s);

// Where media file `rel` ("image" or "video", for the messages and the "bad ... path" reason)
// lives: inside rules.image_root once "..", "." and symlinks are resolved, or absolute when
// the rules allow it. root_out receives the resolved root. Throws LineError.
std::filesystem::path resolve_media(const std::string& rel, const LineRules& rules,
                                    std::string& root_out, const std::string& kind);

// Default cap on H*W: 2^26 pixels (8192 x 8192), far above any resized image but low
// enough that a malicious or broken header cannot make a decoder allocate gigabytes.
inline constexpr int64_t kDefaultMaxImagePixels = int64_t(1) << 26;

// "a: 1, b: 2" for log lines and reports.
std::string format_counts(const std::map<std::string, int64_t>& counts);

}  // namespace dhp
