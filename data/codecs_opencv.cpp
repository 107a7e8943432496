// libdhp_codecs.so: the operations of data/codecs.h on OpenCV's imgcodecs and videoio. Built
// as a shared library of its own so that only the processes that decode or encode media load
// those libraries (data/codecs.h says why).
#include <opencv2/imgcodecs.hpp>
#include <opencv2/videoio.hpp>

#include "data/codecs.h"

namespace {

using dhp::codecs::Api;

cv::VideoCapture* cap(void* c) { return static_cast<cv::VideoCapture*>(c); }
cv::VideoWriter* writer(void* w) { return static_cast<cv::VideoWriter*>(w); }

const Api kApi = {
    dhp::codecs::kApiVersion,
    DHP_CODECS_BUILD_ID,
    [](const uint8_t* data, size_t n, int flags, cv::Mat* out) {
      const cv::Mat raw(1, int(n), CV_8U, const_cast<uint8_t*>(data));
      *out = cv::imdecode(raw, flags);
      return !out->empty();
    },
    [](const char* ext, const cv::Mat* img, std::vector<uint8_t>* out, const std::vector<int>* params) {
      return cv::imencode(ext, *img, *out, *params);
    },
    [](const char* path, const cv::Mat* img, const std::vector<int>* params) {
      return cv::imwrite(path, *img, *params);
    },
    [](const char* path, int flags, cv::Mat* out) {
      *out = cv::imread(path, flags);
      return !out->empty();
    },
    []() -> void* { return new cv::VideoCapture(); },
    [](void* c) { delete cap(c); },
    [](void* c, const char* name, int api) { return cap(c)->open(name, api); },
    [](const void* c, int prop) { return static_cast<const cv::VideoCapture*>(c)->get(prop); },
    [](void* c, int prop, double value) { return cap(c)->set(prop, value); },
    [](void* c) { return cap(c)->grab(); },
    [](void* c, cv::Mat* frame) { return cap(c)->read(*frame); },
    [](const char* path, int api, int fourcc, double fps, int w, int h) -> void* {
      return new cv::VideoWriter(path, api, fourcc, fps, cv::Size(w, h));
    },
    [](void* w) { delete writer(w); },
    [](const void* w) { return static_cast<const cv::VideoWriter*>(w)->isOpened(); },
    [](void* w, const cv::Mat* frame) { writer(w)->write(*frame); },
    [](void* w) { writer(w)->release(); },
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const Api* dhp_codecs_api() { return &kApi; }
