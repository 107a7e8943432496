#include "data/video.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>

#include "core/check.h"
#include "core/hash.h"
#include "core/input.h"
#include "data/codecs.h"
#include "data/manifest.h"
#include "data/tokenizer.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A target at most this many frames ahead is reached by decoding forward. OpenCV's FFmpeg
// seek jumps to 16 frames before the target, then back to the keyframe before that, and
// decodes forward from there, so a seek costs at least 17 decodes plus a demuxer reset: it
// pays only for gaps well past that (docs/data.md has the measurements).
constexpr int64_t kSeekGap = 32;

// FFmpeg picks a demuxer by the bytes it reads, and some read other files than the one they
// are given: an HLS playlist, a DASH manifest or an ffconcat script names its segments by path,
// an image-sequence pattern a series of files. A file that holds such text would have FFmpeg
// read (and dhp train on) media outside the data root. So only container demuxers that read
// nothing but the given file are allowed, over the file protocol alone. OpenCV passes the
// options of OPENCV_FFMPEG_CAPTURE_OPTIONS ("key;value|key;value") to avformat_open_input;
// they are set once, before the first capture opens, after any the user set (a later key
// wins).
constexpr const char* kDemuxers =
    "avi,mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,mpegts,flv,ogg,mpeg,m4v,h264,hevc,mjpeg,asf";

void confine_ffmpeg() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* user = std::getenv("OPENCV_FFMPEG_CAPTURE_OPTIONS");
    const std::string ours = confined_ffmpeg_options();
    const std::string all = user && *user ? std::string(user) + "|" + ours : ours;
    ::setenv("OPENCV_FFMPEG_CAPTURE_OPTIONS", all.c_str(), 1);
  });
}

}  // namespace

void prepare_media_decoding() {
  confine_ffmpeg();
  codecs::api();
}

namespace {

// Text formats that name other files, told by their first bytes: refused by name before FFmpeg
// sees them (the demuxer list refuses them too, with a vaguer message).
std::string referencing_format(const InputFile& f) {
  char head[64] = {};
  const int64_t n = f.read_at(head, int64_t(sizeof head) - 1, 0);
  std::string_view s(head, size_t(std::max<int64_t>(n, 0)));
  if (s.substr(0, 3) == "\xEF\xBB\xBF") s.remove_prefix(3);
  while (!s.empty() && (s[0] == ' ' || s[0] == '\t' || s[0] == '\r' || s[0] == '\n')) s.remove_prefix(1);
  if (s.rfind("#EXTM3U", 0) == 0) return "an HLS playlist";
  if (s.rfind("ffconcat", 0) == 0) return "an ffconcat script";
  if (s.rfind("<?xml", 0) == 0 || s.rfind("<MPD", 0) == 0) return "an XML document (a DASH manifest?)";
  return "";
}

std::unique_ptr<InputFile> open_video_file(const std::string& path, const std::string& root) {
  const std::string prefix = root == "/" ? root : root + "/";
  if (!root.empty() && path.compare(0, prefix.size(), prefix) == 0)
    return std::make_unique<InputFile>("video", root, path, "");
  return std::make_unique<InputFile>("video", path);
}

}  // namespace

std::string confined_ffmpeg_options() {
  return fmt::format("format_whitelist;{}|protocol_whitelist;file", kDemuxers);
}

uint64_t video_file_hash(const std::string& path, const std::string& root) {
  return hash_from(*open_video_file(path, root), 0);
}

std::vector<int64_t> sample_frames(int64_t frames, double fps, const VideoRules& r) {
  DHP_CHECK(frames > 0 && fps > 0, "sample_frames: {} frames at {} fps", frames, fps);
  const double seconds = double(frames) / fps;
  int64_t n = std::llround(seconds * r.fps);
  n = std::clamp<int64_t>(n, r.min_frames, r.max_frames);
  n = std::clamp<int64_t>(n, 1, frames);
  std::vector<int64_t> out(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i)
    out[size_t(i)] = std::min(frames - 1, int64_t(std::floor((double(i) + 0.5) * double(frames) /
                                                             double(n))));
  return out;
}

ImageSize frame_size(ImageSize source, int64_t n, const ImageGeometry& vision,
                     const VideoRules& r) {
  DHP_CHECK(n >= 1, "frame_size: {} frames", n);
  // Every frame becomes image_size x image_size by prepare_image (pad or crop, then resize);
  // kept at its own size until then, so that the pad and the crop see its aspect ratio.
  if (vision.fixed_square()) return source;
  ImageGeometry g = vision;
  g.max_pixels = std::clamp(r.max_pixels / n, std::min(vision.min_pixels, vision.max_pixels),
                            vision.max_pixels);
  ImageSize s = resized_size(source.h, source.w, g);
  // The budgeted size can fall below vision.min_pixels (the rule floors both sides); the
  // plain rule then lifts it. Iterate to its fixed point so the stored frame predicts its
  // own tokens.
  for (int it = 0; it < 4; ++it) {
    const ImageSize next = resized_size(s.h, s.w, vision);
    if (next.h == s.h && next.w == s.w) return s;
    s = next;
  }
  throw Error(fmt::format("a {}x{} video frame has no stable size under model.vision "
                          "min_pixels = {} and max_pixels = {}",
                          source.h, source.w, vision.min_pixels, vision.max_pixels));
}

std::string frame_timestamp(double time) { return fmt::format("{:.1f}s", time); }

std::string frame_pair_timestamp(double time) { return fmt::format("<{:.1f} seconds>", time); }

std::string frame_label(size_t i) { return fmt::format("Frame{}: ", i + 1); }

VideoReader::VideoReader(const std::string& path, const std::string& root, bool seek)
    : path_(path), seek_(seek) {
  try {
    file_ = open_video_file(path, root);
  } catch (const Error& e) {
    std::error_code ec;
    throw LineError{fs::exists(fs::symlink_status(path, ec)) ? "unreadable video" : "missing video",
                    e.what()};
  }
  const std::string refers = referencing_format(*file_);
  if (!refers.empty())
    throw LineError{"unreadable video", fmt::format("'{}' is {}, not a video file: such files name other "
                                                    "files, which dhp does not read", path, refers)};
  confine_ffmpeg();
  // FFmpeg reads the descriptor opened and checked above, never the path again.
  const std::string fd_path = fmt::format("/proc/self/fd/{}", file_->fd());
  DHP_CHECK(fs::exists(fd_path),
            "cannot decode video '{}': {} is missing (is /proc mounted?)", path, fd_path);
  cap_ = std::make_unique<codecs::VideoCapture>();
  if (file_->size() == 0 || !reopen())
    throw LineError{"unreadable video",
                    fmt::format("'{}' is not a video FFmpeg can open (empty, unknown container "
                                "or codec)",
                                path)};
  info_.frames = std::llround(cap_->get(cv::CAP_PROP_FRAME_COUNT));
  info_.fps = cap_->get(cv::CAP_PROP_FPS);
  info_.size = {int(cap_->get(cv::CAP_PROP_FRAME_HEIGHT)),
                int(cap_->get(cv::CAP_PROP_FRAME_WIDTH))};
  if (info_.frames <= 0 || !(info_.fps > 0 && info_.fps < 1e4) || info_.size.h <= 0 ||
      info_.size.w <= 0)
    throw LineError{"unreadable video",
                    fmt::format("'{}': the container states no usable frame count, rate or size "
                                "({} frames at {} fps, {}x{})",
                                path, info_.frames, info_.fps, info_.size.h, info_.size.w)};
}

VideoReader::~VideoReader() = default;

bool VideoReader::reopen() {
  next_ = 0;
  return cap_->open(fmt::format("/proc/self/fd/{}", file_->fd()), cv::CAP_FFMPEG);
}

bool VideoReader::first_frame_decodes() {
  if (!reopen()) return false;
  cv::Mat m;
  const bool ok = cap_->read(m) && !m.empty();
  next_ = ok ? 1 : 0;
  return ok;
}

cv::Mat VideoReader::frame(int64_t index) {
  DHP_CHECK(index >= 0, "video '{}': frame {}", path_, index);
  auto fail = [&](const std::string& what) {
    // Nothing decoded yet: tell a clip that breaks off later from one with no usable frame.
    if (!any_ && (index == 0 || !first_frame_decodes()))
      return LineError{"corrupt video",
                       fmt::format("'{}': no frame decodes ({}; the container states {} "
                                   "frames)",
                                   path_, what, info_.frames)};
    return LineError{"truncated video",
                     fmt::format("'{}': frame {} of the {} the container states does not "
                                 "decode ({}): the file ends early or is damaged",
                                 path_, index, info_.frames, what)};
  };
  if (index >= info_.frames) throw fail("past the stated frame count");
  if (seek_ && (index < next_ || index - next_ > kSeekGap)) {
    if (cap_->set(cv::CAP_PROP_POS_FRAMES, double(index))) {
      ++seeks_;
      next_ = index;
    } else {
      // A container without a usable index (a cut-off AVI loses it): decode forward from
      // the start instead, for this clip from now on.
      seek_ = false;
      if (!reopen()) throw fail("it cannot be reopened after a failed seek");
    }
  }
  if (index < next_ && !reopen()) throw fail("it cannot be reopened to go back");
  for (; next_ < index; ++next_, ++decoded_)
    if (!cap_->grab()) throw fail("the stream ends before it");
  cv::Mat out;
  if (!cap_->read(out) || out.empty()) throw fail("the decoder returns nothing");
  ++decoded_;
  ++next_;
  // A seek that landed elsewhere (broken timestamps) would give another frame's pixels.
  const auto pos = std::llround(cap_->get(cv::CAP_PROP_POS_FRAMES));
  if (pos != next_) throw fail(fmt::format("the decoder is at frame {} instead", pos - 1));
  if (out.type() != CV_8UC3 || out.rows != info_.size.h || out.cols != info_.size.w)
    throw LineError{"corrupt video",
                    fmt::format("'{}': frame {} decodes to {}x{} ({} channels), the container "
                                "says {}x{}",
                                path_, index, out.rows, out.cols, out.channels(), info_.size.h,
                                info_.size.w)};
  any_ = true;
  return out;
}

VideoReader& FrameReader::open(const std::string& path) {
  if (!reader_ || reader_->path() != path)
    reader_ = std::make_unique<VideoReader>(path, root_, seek_);
  return *reader_;
}

cv::Mat FrameReader::read(const std::string& path, const FrameRef& ref, ImageSize size) {
  VideoReader& r = open(path);
  if (r.info().frames != ref.count || r.info().size.h != ref.source.h ||
      r.info().size.w != ref.source.w)
    throw LineError{"corrupt video",
                    fmt::format("'{}' changed since it was indexed: {} frames of {}x{}, the "
                                "index has {} of {}x{}",
                                path, r.info().frames, r.info().size.h, r.info().size.w,
                                ref.count, ref.source.h, ref.source.w)};
  const cv::Mat bgr = r.frame(ref.index);
  if (bgr.rows == size.h && bgr.cols == size.w) return bgr;
  cv::Mat out;
  const bool shrink = size.h <= bgr.rows && size.w <= bgr.cols;
  cv::resize(bgr, out, cv::Size(size.w, size.h), 0, 0, shrink ? cv::INTER_AREA : cv::INTER_CUBIC);
  return out;
}

void FrameReader::check_end(const std::string& path, const FrameRef& ref) {
  open(path).frame(ref.count - 1);
}

FrameRef second_frame(const FrameRef& pair) {
  FrameRef f = pair;
  f.index = pair.pair;
  f.pair = -1;
  return f;
}

void check_line_frames(const ParsedLine& line, std::vector<cv::Mat>* out, std::vector<cv::Mat>* second) {
  if (out) out->assign(line.paths.size(), cv::Mat());
  if (second) second->assign(line.paths.size(), cv::Mat());
  FrameReader reader(line.root);
  for (size_t k = 0; k < line.paths.size(); ++k) {
    const FrameRef& ref = line.frames[k];
    if (ref.index < 0) continue;
    cv::Mat m = reader.read(line.paths[k], ref, line.sizes[k]);
    // A pair's second frame decodes too; an odd count's last frame, paired with itself, is the
    // one just read (reading it again would seek back).
    const int64_t top = std::max(ref.index, ref.pair);
    if (ref.pair >= 0) {
      cv::Mat b = ref.pair == ref.index ? m.clone() : reader.read(line.paths[k], second_frame(ref), line.sizes[k]);
      if (second) (*second)[k] = std::move(b);
    }
    if (out) (*out)[k] = std::move(m);
    const bool last = k + 1 == line.paths.size() || line.frames[k + 1].index <= top ||
                      line.paths[k + 1] != line.paths[k];
    if (last && top != ref.count - 1) reader.check_end(line.paths[k], ref);
  }
}

void place_videos(ParsedLine& line, const std::vector<std::string>& image_paths,
                  const std::vector<ImageSize>& image_sizes,
                  const std::vector<std::string>& videos, const Tokenizer& tok,
                  const ImageGeometry& vision, const VideoRules& rules,
                  int64_t max_image_pixels) {
  const int64_t n_video_markers =
      std::count(line.layout.begin(), line.layout.end(), kVideoMarker);
  if (n_video_markers != int64_t(videos.size()))
    throw LineError{"video count mismatch", fmt::format("{} <video> markers for {} videos",
                                                        n_video_markers, videos.size())};
  // Each video's frames, from its container alone.
  struct Clip {
    std::vector<FrameRef> frames;
    ImageSize size;
  };
  std::vector<Clip> clips;
  for (const std::string& path : videos) {
    const VideoReader r(path, line.root);
    const VideoInfo& info = r.info();
    if (max_image_pixels > 0 && int64_t(info.size.h) * info.size.w > max_image_pixels)
      throw LineError{"video too large",
                      fmt::format("{}: {}x{} frames > data.max_image_pixels = {}", path,
                                  info.size.h, info.size.w, max_image_pixels)};
    Clip c;
    for (int64_t f : sample_frames(info.frames, info.fps, rules))
      c.frames.push_back({f, info.frames, info.size, double(f) / info.fps});
    try {
      c.size = frame_size(info.size, int64_t(c.frames.size()), vision.frame_geometry(), rules);
    } catch (const Error& e) {
      throw LineError{"unreadable video", fmt::format("{}: {}", path, e.what())};
    }
    clips.push_back(std::move(c));
  }

  std::vector<int32_t> layout;
  std::vector<uint8_t> loss;
  line.paths.clear();
  line.sizes.clear();
  line.frames.clear();
  size_t next_video = 0;
  auto place = [&](const std::string& path, ImageSize size, const FrameRef& ref) {
    line.paths.push_back(path);
    line.sizes.push_back(size);
    line.frames.push_back(ref);
    layout.push_back(-int32_t(line.paths.size()));
    loss.push_back(0);
  };
  for (size_t i = 0; i < line.layout.size(); ++i) {
    const int32_t v = line.layout[i];
    if (v >= 0) {
      layout.push_back(v);
      loss.push_back(line.loss[i]);
    } else if (v == kVideoMarker) {
      // Each frame an image after its timestamp; or, for a tower that embeds frame pairs, each
      // pair one image after the pair's (Qwen3-VL's "<t seconds>"); or, for a tiled tower, each
      // frame one tile between "Frame{i}: " and "\n" (InternVL's chat code).
      const Clip& c = clips[next_video];
      const size_t per = size_t(vision.video_frames_per_image);
      auto text = [&](const std::string& t) {
        const auto ids = tok.encode(t);
        layout.insert(layout.end(), ids.begin(), ids.end());
        loss.insert(loss.end(), ids.size(), 0);
      };
      for (size_t g = 0; g < c.frames.size(); g += per) {
        FrameRef ref = c.frames[g];
        std::string stamp = vision.tiled() ? frame_label(g) : frame_timestamp(ref.time);
        if (per > 1) {
          const FrameRef& second = c.frames[std::min(g + 1, c.frames.size() - 1)];
          ref.pair = second.index;
          stamp = frame_pair_timestamp((ref.time + second.time) / 2);
        }
        text(stamp);
        place(videos[next_video], c.size, ref);
        if (vision.tiled()) text("\n");
      }
      ++next_video;
    } else {
      const size_t k = size_t(-v - 1);
      DHP_ASSERT(k < image_paths.size());
      place(image_paths[k], image_sizes[k], FrameRef{});
    }
  }
  line.layout = std::move(layout);
  line.loss = std::move(loss);
}

}  // namespace dhp
