// Image and video codecs: OpenCV's imgcodecs and videoio, behind a seam. Those two libraries
// pull in about 190 more (FFmpeg, GDAL, GStreamer, libheif...), whose loading took 0.17 s of
// the 0.22 s that every start of `dhp` (and of every test process) cost, whether it read an
// image or not. They live in a library of their own, libdhp_codecs.so (data/codecs_opencv.cpp),
// which the first decode or encode loads; `dhp plan`, `tokenize`, `export` and the training
// ranks' start no longer pay for them. OpenCV's core and imgproc (cv::Mat, resizing) stay
// linked: they are cheap to load.
#pragma once

#include <opencv2/core.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dhp::codecs {

// cv::imdecode of n encoded bytes with cv::IMREAD_* flags; an empty Mat when they do not
// decode.
cv::Mat decode_image(const uint8_t* data, size_t n, int flags);
// cv::imencode into `out` (".png", ".jpg") with cv::IMWRITE_* parameters.
bool encode_image(const std::string& ext, const cv::Mat& img, std::vector<uint8_t>& out,
                  const std::vector<int>& params);
// cv::imwrite and cv::imread (for tools and tests: data sets read their images through
// core/input.h and decode_image).
bool write_image(const std::string& path, const cv::Mat& img, const std::vector<int>& params = {});
cv::Mat read_image(const std::string& path, int flags);

// cv::VideoWriter::fourcc.
constexpr int fourcc(char a, char b, char c, char d) {
  return int(uint8_t(a)) | int(uint8_t(b)) << 8 | int(uint8_t(c)) << 16 | int(uint8_t(d)) << 24;
}

// cv::VideoCapture: open(name, api), get/set of cv::CAP_PROP_*, grab, read.
class VideoCapture {
 public:
  VideoCapture();
  ~VideoCapture();
  VideoCapture(const VideoCapture&) = delete;
  VideoCapture& operator=(const VideoCapture&) = delete;
  bool open(const std::string& name, int api);
  double get(int prop) const;
  bool set(int prop, double value);
  bool grab();
  bool read(cv::Mat& frame);

 private:
  void* impl_;
};

// cv::VideoWriter opened on `path`.
class VideoWriter {
 public:
  VideoWriter(const std::string& path, int api, int fourcc, double fps, cv::Size size);
  ~VideoWriter();
  VideoWriter(const VideoWriter&) = delete;
  VideoWriter& operator=(const VideoWriter&) = delete;
  bool opened() const;
  void write(const cv::Mat& frame);
  void release();

 private:
  void* impl_;
};

// The table libdhp_codecs.so exports (dhp_codecs_api), one entry per operation above. Its
// version changes with its layout, so a library from another build is refused, not misread.
struct Api {
  int version;
  const char* build;  // DHP_CODECS_BUILD_ID of the build that made the library
  bool (*decode_image)(const uint8_t* data, size_t n, int flags, cv::Mat* out);
  bool (*encode_image)(const char* ext, const cv::Mat* img, std::vector<uint8_t>* out, const std::vector<int>* params);
  bool (*write_image)(const char* path, const cv::Mat* img, const std::vector<int>* params);
  bool (*read_image)(const char* path, int flags, cv::Mat* out);
  void* (*capture_new)();
  void (*capture_free)(void* c);
  bool (*capture_open)(void* c, const char* name, int api);
  double (*capture_get)(const void* c, int prop);
  bool (*capture_set)(void* c, int prop, double value);
  bool (*capture_grab)(void* c);
  bool (*capture_read)(void* c, cv::Mat* frame);
  void* (*writer_new)(const char* path, int api, int fourcc, double fps, int w, int h);
  void (*writer_free)(void* w);
  bool (*writer_opened)(const void* w);
  void (*writer_write)(void* w, const cv::Mat* frame);
  void (*writer_release)(void* w);
};
inline constexpr int kApiVersion = 1;
// Api::build: what a library must have been built with to be used, this header's contents
// (its hash, DHP_CODECS_INTERFACE, which CMake defines for data/codecs.cpp and the library
// alone) and OpenCV's version (cv::Mat crosses the table).
#define DHP_CODECS_BUILD_ID DHP_CODECS_INTERFACE "+opencv-" CV_VERSION
inline constexpr const char* kApiSymbol = "dhp_codecs_api";
inline constexpr const char* kLibraryName = "libdhp_codecs.so";

// The loaded table: the library is loaded on first use, once; when it cannot be, this and
// every later call throw the same Error naming where it looked (no retry per sample).
const Api& api();

}  // namespace dhp::codecs
