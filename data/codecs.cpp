#include "data/codecs.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>
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

const Api& load() {
  std::string tried;
  for (const std::string& path : candidates()) {
    std::error_code ec;
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
    DHP_CHECK(entry != nullptr, "{} has no {}: not dhp's image and video codec library", path, kApiSymbol);
    const Api* a = entry();
    DHP_CHECK(a->version == kApiVersion, "{} is from another build of dhp (codec table version {}, this "
              "dhp needs {}): rebuild or reinstall both together", path, a->version, kApiVersion);
    return *a;
  }
  throw Error(fmt::format("cannot load {} (dhp's image and video codecs, on OpenCV's imgcodecs and videoio); "
                          "it belongs beside the dhp executable. Looked at:{}", kLibraryName, tried));
}

}  // namespace

const Api& api() {
  static const Api& a = load();
  return a;
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
