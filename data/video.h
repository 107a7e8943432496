// Video samples: `"video": "clip.mp4"` (or a list, or "videos") in a manifest line, placed by
// a `<video>` marker. A video becomes a run of frames sampled uniformly in time, each laid
// out as its own image (its own <img> ... </img> block and 2-D positions) after a timestamp
// text prefix, so everything past the manifest (packing, planner, model) sees images only.
//
// Decoding is OpenCV's videoio on FFmpeg. The file is opened once through core/input.h
// (a regular file, confined to the data root) and FFmpeg reads that open descriptor through
// /proc/self/fd, so what was checked is what is decoded and a path can never name an FFmpeg
// protocol ("pipe:", "concat:", ...).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <opencv2/core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/image.h"
#include "types/image_geometry.h"

namespace dhp {
namespace codecs {
class VideoCapture;
}

class InputFile;
class Tokenizer;
struct ParsedLine;

// The [data] keys for video (trainer/config.cpp holds their ranges).
struct VideoRules {
  double fps = 1.0;                          // data.video_fps: frames sampled per second
  int min_frames = 4;                        // data.min_frames (fewer when the clip has fewer)
  int max_frames = 768;                      // data.max_frames (Qwen2-VL's cap): the pixel
                                             // budget, not the count, bounds a clip's tokens
  int64_t max_pixels = int64_t(8) << 20;     // data.video_max_pixels: all frames of one video
};

// What the container says, read without decoding the clip.
struct VideoInfo {
  int64_t frames = 0;  // frame count
  double fps = 0;
  ImageSize size;      // of every frame
  double seconds() const { return double(frames) / fps; }
};

// One image of a parsed line that comes from a video (index < 0: an image file).
struct FrameRef {
  int64_t index = -1;  // frame of the video
  int64_t count = 0;   // the container's frame count
  ImageSize source;    // the container's frame size: what decoding must give
  double time = 0;     // seconds from the start: index / fps
  // The second frame of a frame pair (ImageGeometry::video_frames_per_image 2: one image of two
  // frames, embedded together), or -1: a frame alone. A clip of an odd count pairs its last
  // frame with itself, as Qwen3-VL's processor pads it.
  int64_t pair = -1;
};

// The frames sampled from a clip of `frames` frames at `fps`: n = round(seconds * rules.fps)
// clamped to [min_frames, max_frames] and to `frames`, at the centres of n equal slices of
// the clip, frame floor((i + 0.5) * frames / n) for i = 0..n-1 (ascending, distinct).
std::vector<int64_t> sample_frames(int64_t frames, double fps, const VideoRules& rules);

// The size each of `n` frames of a `source` video is stored and encoded at: the vision
// resize rule with max_pixels lowered to the per-video budget,
//   b = clamp(rules.max_pixels / n, vision.min_pixels, vision.max_pixels),
// so a long clip gets smaller frames; the result is a fixed point of the plain resize rule
// (resized_size(result, vision) == result), so a frame stored at this size by `dhp data
// build` counts the same tokens as an image of that size. Under resize = pad_square the
// frame keeps its source size: prepare_image pads and resizes it to image_size like any
// image. Throws dhp::Error when the vision settings admit no such size.
ImageSize frame_size(ImageSize source, int64_t n, const ImageGeometry& vision,
                     const VideoRules& rules);

// The timestamp text before frame `time`: "12.5s" (one decimal).
std::string frame_timestamp(double time);
// The timestamp text before a frame pair, at the mean of its two frames' times, as Qwen3-VL's
// processor writes it: "<12.5 seconds>".
std::string frame_pair_timestamp(double time);
// The text before frame i (0-based) of a tiled tower's video, as InternVL's chat code writes
// it: "Frame1: " (a "\n" follows the frame).
std::string frame_label(size_t i);

// An open video: the file checked and held, the container probed. Throws LineError:
// "missing video", "unreadable video" (not a regular file, or a container or codec FFmpeg
// cannot open, or no frame count, rate or size in it).
class VideoReader {
 public:
  // `root` non-empty: `path` lies inside it and is opened without leaving it (core/input.h).
  // seek = false decodes every frame up to each one asked for (the bench's comparison).
  VideoReader(const std::string& path, const std::string& root, bool seek = true);
  ~VideoReader();
  VideoReader(const VideoReader&) = delete;
  VideoReader& operator=(const VideoReader&) = delete;

  const VideoInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  // Frame `index` (BGR, info().size). Jumps there by seeking when it lies behind or more than
  // 32 frames ahead, else decodes forward. Throws LineError: "corrupt video" when no
  // frame has decoded yet (zero decodable frames) or a frame has another size, "truncated
  // video" when the clip ends (or breaks off) before `index`.
  cv::Mat frame(int64_t index);
  // Frames decoded by reading forward (those read past included); the decoding a seek does
  // inside OpenCV (from the keyframe before target - 16 on) is not seen here.
  int64_t decoded() const { return decoded_; }
  int64_t seeks() const { return seeks_; }

 private:
  bool reopen();               // back to frame 0 with a fresh decoder
  bool first_frame_decodes();  // reopens and decodes frame 0
  std::string path_;
  std::unique_ptr<InputFile> file_;
  std::unique_ptr<codecs::VideoCapture> cap_;
  VideoInfo info_;
  bool seek_ = true;
  int64_t next_ = 0;  // the frame the next read returns
  int64_t decoded_ = 0, seeks_ = 0;
  bool any_ = false;  // a frame has decoded
};

// Reads the frames of consecutive images of one sample, keeping the current video open
// while its frames come in order, so a clip is opened once per load.
class FrameReader {
 public:
  explicit FrameReader(std::string root, bool seek = true)
      : root_(std::move(root)), seek_(seek) {}
  // Frame `ref` of the video at `path`, decoded, checked against ref.source and resized to
  // `size` (INTER_AREA when shrinking, else INTER_CUBIC). Throws LineError.
  cv::Mat read(const std::string& path, const FrameRef& ref, ImageSize size);
  // Decodes the container's last frame: the build and the manifest check call it after a
  // video's sampled frames, so a clip whose stated frame count overshoots what the file
  // holds is caught before its lengths are trusted ("truncated video").
  void check_end(const std::string& path, const FrameRef& ref);

 private:
  VideoReader& open(const std::string& path);
  std::string root_;
  bool seek_;
  std::unique_ptr<VideoReader> reader_;
};

// The second frame of a frame pair, as a frame of its own.
FrameRef second_frame(const FrameRef& pair);

// Checks every image of a parsed line that comes from a video by decoding it (and each
// video's last frame), as the build and JsonlDataset do when they take a line in. `out`, when
// given, receives each frame (BGR at line.sizes[k]) at its image index, and `second` a frame
// pair's second frame; other entries stay empty. Throws LineError.
void check_line_frames(const ParsedLine& line, std::vector<cv::Mat>* out,
                       std::vector<cv::Mat>* second = nullptr);

// What dhp sets OPENCV_FFMPEG_CAPTURE_OPTIONS to before its first capture (after the user's
// own, if any): container demuxers that read only the file they are given, over the file
// protocol alone. A playlist, manifest, concat script or image sequence names other files,
// which FFmpeg would read; none of their demuxers is allowed.
std::string confined_ffmpeg_options();

// Loads the image and video codecs (data/codecs.h) and sets FFmpeg's confinement, on the
// calling thread. Data sets and builds call it before their workers start: a missing codec
// library is then one clear error at start, not every image skipped as corrupt, and the
// environment FFmpeg reads is set before any worker can run it.
void prepare_media_decoding();

// FNV-1a of a clip file's bytes, opened as the readers open it (inside `root` when it lies
// there): what ranks compare of a manifest's clips.
uint64_t video_file_hash(const std::string& path, const std::string& root);

// The parse_line step for videos: `layout` holds kVideoMarker for each <video> marker and
// -(k+1) for image k; replaces each video marker by its frames (timestamp tokens, then one
// image placeholder each) and renumbers every placeholder in layout order, filling
// line.paths / sizes / frames in that order. `image_paths` / `image_sizes` are the line's
// image files; `videos` its resolved video paths. Throws LineError ("video count mismatch",
// "missing video", "unreadable video", "video too large").
void place_videos(ParsedLine& line, const std::vector<std::string>& image_paths,
                  const std::vector<ImageSize>& image_sizes,
                  const std::vector<std::string>& videos, const Tokenizer& tok,
                  const ImageGeometry& vision, const VideoRules& rules, int64_t max_image_pixels);

// The marker that places the next video in a human turn.
inline constexpr std::string_view kVideoTag = "<video>";

// The layout value of a <video> marker before place_videos: below every image placeholder.
inline constexpr int32_t kVideoMarker = INT32_MIN;

}  // namespace dhp
