#include "data/codecs.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "core/check.h"

namespace dhp::codecs {
namespace {

namespace fs = std::filesystem;

// Beside the running executable (an installed `dhp`, or build/dhp), then where the build put
// it (test and bench executables live in folders of their own).
std::vector<std::string> candidates() {
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) out.push_back((exe.parent_path() / kLibraryName).string());
#ifdef DHP_CODECS_BUILD_PATH
  out.push_back(DHP_CODECS_BUILD_PATH);
#endif
  return out;
}

// The first candidate that is dhp's codec library from this very build; what each other one
// was, for the message when none is.
struct Loaded {
  const Api* api = nullptr;
  std::string error;
};

Loaded load() {
  std::string tried;
  std::vector<std::string> paths = candidates();
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    std::error_code ec;
    if (std::find(paths.begin(), paths.begin() + long(i), path) != paths.begin() + long(i)) continue;
    if (!fs::exists(path, ec)) {
      tried += fmt::format("\n  {}: not there", path);
      continue;
    }
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried += fmt::format("\n  {}: {}", path, ::dlerror());
      continue;
    }
    using Entry = const Api* (*)();
    const auto entry = reinterpret_cast<Entry>(::dlsym(lib, kApiSymbol));
    const Api* a = entry ? entry() : nullptr;
    if (!a) {
      tried += fmt::format("\n  {}: has no {} (not dhp's codec library)", path, kApiSymbol);
    } else if (a->version != kApiVersion) {  // another layout: its build field may not be there
      tried += fmt::format("\n  {}: codec table version {}, this dhp reads {}", path, a->version, kApiVersion);
    } else if (std::string_view(a->build) != DHP_CODECS_BUILD_ID) {
      tried += fmt::format("\n  {}: from another build of dhp ({}; this dhp is {})", path, a->build,
                           DHP_CODECS_BUILD_ID);
    } else {
      return {a, ""};
    }
    ::dlclose(lib);
  }
  return {nullptr, fmt::format("cannot load {} (dhp's image and video codecs, on OpenCV's imgcodecs and "
                               "videoio), which belongs beside the dhp executable of the same build. "
                               "Looked at:{}", kLibraryName, tried)};
}

}  // namespace

const Api& api() {
  static const Loaded loaded = load();
  if (!loaded.api) throw Error(loaded.error);
  return *loaded.api;
}

cv::Mat decode_image(const uint8_t* data, size_t n, int flags) {
  cv::Mat out;
  api().decode_image(data, n, flags, &out);
  return out;
}

bool encode_image(const std::string& ext, const cv::Mat& img, std::vector<uint8_t>& out,
                  const std::vector<int>& params) {
  return api().encode_image(ext.c_str(), &img, &out, &params);
}

bool write_image(const std::string& path, const cv::Mat& img, const std::vector<int>& params) {
  return api().write_image(path.c_str(), &img, &params);
}

cv::Mat read_image(const std::string& path, int flags) {
  cv::Mat out;
  api().read_image(path.c_str(), flags, &out);
  return out;
}

VideoCapture::VideoCapture() : impl_(api().capture_new()) {}
VideoCapture::~VideoCapture() { api().capture_free(impl_); }
bool VideoCapture::open(const std::string& name, int api_pref) { return api().capture_open(impl_, name.c_str(), api_pref); }
double VideoCapture::get(int prop) const { return api().capture_get(impl_, prop); }
bool VideoCapture::set(int prop, double value) { return api().capture_set(impl_, prop, value); }
bool VideoCapture::grab() { return api().capture_grab(impl_); }
bool VideoCapture::read(cv::Mat& frame) { return api().capture_read(impl_, &frame); }

VideoWriter::VideoWriter(const std::string& path, int api_pref, int fourcc, double fps, cv::Size size)
    : impl_(api().writer_new(path.c_str(), api_pref, fourcc, fps, size.width, size.height)) {}
VideoWriter::~VideoWriter() { api().writer_free(impl_); }
bool VideoWriter::opened() const { return api().writer_opened(impl_); }
void VideoWriter::write(const cv::Mat& frame) { api().writer_write(impl_, &frame); }
void VideoWriter::release() { api().writer_release(impl_); }

}  // namespace dhp::codecs
