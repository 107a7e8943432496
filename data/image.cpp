#include "data/image.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/check.h"
#include "core/input.h"
#include "data/codecs.h"
#include "data/resample.h"

namespace dhp {

namespace {

// CLIP's normalisation constants, as model-spec.md fixes them.

uint32_t be32(const unsigned char* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
}
uint32_t be16(const unsigned char* b) { return (uint32_t(b[0]) << 8) | b[1]; }

// Reads a header in order through the one descriptor that was opened and checked.
class HeaderReader {
 public:
  explicit HeaderReader(const InputFile& f) : f_(f) {}
  int64_t read(unsigned char* out, int64_t n) {
    const int64_t got = f_.read_at(out, n, pos_);
    pos_ += got;
    return got;
  }
  int get() {
    unsigned char c = 0;
    return read(&c, 1) == 1 ? c : EOF;
  }
  void seek(int64_t pos) { pos_ = pos; }
  void skip(int64_t n) { pos_ += n; }
  bool good() const { return pos_ <= f_.size(); }

 private:
  const InputFile& f_;
  int64_t pos_ = 0;
};

ImageSize png_size(HeaderReader& in, const std::string& path) {
  // signature(8) | chunk length(4) | "IHDR" | width(4) | height(4): IHDR must come first.
  unsigned char b[24];
  DHP_CHECK(in.read(b, 24) == 24, "image '{}': truncated PNG header", path);
  DHP_CHECK(std::equal(b + 12, b + 16, "IHDR"), "image '{}': PNG without an IHDR chunk", path);
  const uint32_t w = be32(b + 16), h = be32(b + 20);
  DHP_CHECK(w > 0 && h > 0 && w < (1u << 31) && h < (1u << 31),
            "image '{}': PNG header gives an invalid size {}x{}", path, w, h);
  return {int(h), int(w)};
}

bool is_sof(int m) {
  // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC), which share the range.
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

// RIFF | size(4) | "WEBP" | a chunk: "VP8 " (lossy: 14-bit sides in the key frame's header),
// "VP8L" (lossless: sides - 1 in 14 bits each after the 0x2f signature) or "VP8X" (extended:
// the canvas's sides - 1 in 24 bits each). An animation is refused: one image per path.
ImageSize webp_size(HeaderReader& in, const std::string& path) {
  unsigned char b[30];
  DHP_CHECK(in.read(b, 30) == 30, "image '{}': truncated WebP header", path);
  const auto le = [&](int at, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint32_t(b[at + i]) << (8 * i);
    return v;
  };
  uint32_t w = 0, h = 0;
  if (std::equal(b + 12, b + 16, "VP8 ")) {
    DHP_CHECK(b[23] == 0x9d && b[24] == 0x01 && b[25] == 0x2a, "image '{}': WebP (lossy) without its frame start code",
              path);
    w = le(26, 2) & 0x3fff, h = le(28, 2) & 0x3fff;
  } else if (std::equal(b + 12, b + 16, "VP8L")) {
    DHP_CHECK(b[20] == 0x2f, "image '{}': WebP (lossless) without its signature byte", path);
    const uint32_t bits = le(21, 4);
    w = (bits & 0x3fff) + 1, h = ((bits >> 14) & 0x3fff) + 1;
  } else if (std::equal(b + 12, b + 16, "VP8X")) {
    DHP_CHECK(!(b[20] & 0x02), "image '{}' is an animated WebP; dhp reads one image per path (save a frame as PNG)",
              path);
    w = le(24, 3) + 1, h = le(27, 3) + 1;
  } else {
    throw Error(fmt::format("image '{}': WebP with an unknown first chunk", path));
  }
  DHP_CHECK(w > 0 && h > 0, "image '{}': WebP header gives size {}x{}", path, w, h);
  return {int(h), int(w)};
}

bool is_webp(const unsigned char* b, int64_t n) {
  return n >= 12 && std::equal(b, b + 4, "RIFF") && std::equal(b + 8, b + 12, "WEBP");
}

bool is_gif(const unsigned char* b, int64_t n) {
  return n >= 6 && (std::equal(b, b + 6, "GIF87a") || std::equal(b, b + 6, "GIF89a"));
}

std::string gif_refusal(const std::string& path) {
  return fmt::format("image '{}' is a GIF, which dhp does not read (OpenCV has no GIF decoder); save its first "
                     "frame as PNG (e.g. `convert '{}[0]' out.png`)", path, path);
}

ImageSize jpeg_size(HeaderReader& in, const std::string& path) {
  in.seek(2);
  for (;;) {
    int c = in.get();
    DHP_CHECK(c != EOF, "image '{}': truncated JPEG header (no frame header found)", path);
    DHP_CHECK(c == 0xFF, "image '{}': malformed JPEG header (expected a marker)", path);
    int m = in.get();
    while (m == 0xFF) m = in.get();  // fill bytes may precede a marker
    DHP_CHECK(m != EOF, "image '{}': truncated JPEG header", path);
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) continue;  // markers without a length
    DHP_CHECK(m != 0xD9 && m != 0xDA,
              "image '{}': JPEG has no frame header before its scan data", path);
    unsigned char len_b[2];
    DHP_CHECK(in.read(len_b, 2) == 2, "image '{}': truncated JPEG header", path);
    const uint32_t len = be16(len_b);
    DHP_CHECK(len >= 2, "image '{}': malformed JPEG segment length", path);
    if (is_sof(m)) {
      unsigned char b[5];  // precision(1) | height(2) | width(2)
      DHP_CHECK(in.read(b, 5) == 5, "image '{}': truncated JPEG frame header", path);
      const uint32_t h = be16(b + 1), w = be16(b + 3);
      // A zero height means "defined later by DNL", which no decoder we use supports.
      DHP_CHECK(w > 0 && h > 0, "image '{}': JPEG frame header gives size {}x{}", path, w, h);
      return {int(h), int(w)};
    }
    in.skip(len - 2);
    DHP_CHECK(in.good(), "image '{}': truncated JPEG header", path);
  }
}

}  // namespace

ImageSize resized_size(int H, int W, const ImageGeometry& v) {
  DHP_CHECK(H > 0 && W > 0, "image size {}x{} is empty", H, W);
  if (v.fixed_square()) {
    DHP_CHECK(v.image_size > 0 && v.image_size % v.factor() == 0,
              "resize {}: image_size {} is not a positive multiple of patch x merge ({})",
              image_fit_name(v.resize), v.image_size, v.factor());
    return {v.image_size, v.image_size};
  }
  const double f = v.factor();
  const double Hd = H, Wd = W;
  // ImageFit::qwen is transformers' smart_resize to the letter: Python's round (half to even,
  // which nearbyint gives in the default rounding mode) and no lift to f before the branches,
  // an aspect ratio above 200 refused, and nothing after the branches. native rounds halves up,
  // lifts to f, and clamps below.
  const bool qwen = v.resize == ImageFit::qwen;
  DHP_CHECK(!qwen || std::max(Hd, Wd) / std::min(Hd, Wd) <= 200.0,
            "image {}x{}: its aspect ratio {:.1f} is above 200, which Qwen2-VL's image processor refuses "
            "(model.vision.resize = \"qwen\")", H, W, std::max(Hd, Wd) / std::min(Hd, Wd));
  auto round_side = [&](double x) {
    return qwen ? std::nearbyint(x / f) * f : std::max(f, std::floor(x / f + 0.5) * f);
  };
  double h = round_side(Hd), w = round_side(Wd);
  if (h * w > double(v.max_pixels)) {
    const double b = std::sqrt(Hd * Wd / double(v.max_pixels));
    h = std::max(f, std::floor(Hd / b / f) * f);
    w = std::max(f, std::floor(Wd / b / f) * f);
  } else if (h * w < double(v.min_pixels)) {
    const double b = std::sqrt(double(v.min_pixels) / (Hd * Wd));
    h = std::ceil(Hd * b / f) * f;
    w = std::ceil(Wd * b / f) * f;
  }
  if (qwen) return {int(h), int(w)};
  // A side lifted to f by the floors above (extreme aspect ratios) can leave h·w above the
  // cap; shortening the longer side restores h·w <= max_pixels whenever f² <= max_pixels.
  if (h * w > double(v.max_pixels)) {
    double& longer = h >= w ? h : w;
    const double shorter = h >= w ? w : h;
    longer = std::floor(double(v.max_pixels) / (shorter * f)) * f;
    DHP_CHECK(longer >= f,
              "image {}x{}: min_pixels {} and max_pixels {} leave no room for a {}-pixel side "
              "next to a {}-pixel one; lower min_pixels or raise max_pixels",
              H, W, v.min_pixels, v.max_pixels, f, shorter);
  }
  return {int(h), int(w)};
}

MergedGrid image_grid(int H, int W, const ImageGeometry& v) {
  if (v.tiled()) {
    // Tiling is the resize rule: every tile is image_size square, whatever model.vision.resize.
    DHP_CHECK(v.image_size > 0 && v.image_size % v.factor() == 0,
              "tiling: image_size {} is not a positive multiple of patch x merge ({})", v.image_size, v.factor());
    DHP_CHECK(H > 0 && W > 0, "image size {}x{} is empty", H, W);
    DHP_CHECK(v.min_tiles >= 1 && v.min_tiles <= v.max_tiles, "tiling: min_tiles {} and max_tiles {} are not a "
              "range of tile counts", v.min_tiles, v.max_tiles);
    const int s = v.image_size / v.factor();
    return {tile_grid(H, W, v).count() * s, s};
  }
  const ImageSize s = resized_size(H, W, v);
  return {s.h / v.patch / v.merge, s.w / v.patch / v.merge};
}

namespace {

// An image inside `root` is opened without leaving it, at every load: a file swapped for a
// symlink out of the root after the manifest was checked is refused, never read.
InputFile open_image(const std::string& path, const std::string& root) {
  const std::string prefix = root == "/" ? root : root + "/";
  if (!root.empty() && path.compare(0, prefix.size(), prefix) == 0)
    return InputFile("image", root, path, "");
  return InputFile("image", path);
}

// Appends an RGB image's patches, row-major over its grid, each patch (dy·p + dx)·3 + c.
void patchify(const cv::Mat& rgb, int p, std::vector<uint8_t>& pixels) {
  const int gw = rgb.cols / p;
  const int64_t pn = int64_t(p) * p * 3, at = int64_t(pixels.size());
  pixels.resize(size_t(at + int64_t(rgb.rows / p) * gw * pn));
  for (int y = 0; y < rgb.rows; ++y) {
    const uint8_t* row = rgb.ptr<uint8_t>(y);
    const int gy = y / p, dy = y % p;
    for (int x = 0; x < rgb.cols; ++x) {
      const int gx = x / p, dx = x % p;
      uint8_t* dst = pixels.data() + at + (int64_t(gy) * gw + gx) * pn + (dy * p + dx) * 3;
      for (int c = 0; c < 3; ++c) dst[c] = row[x * 3 + c];
    }
  }
}

// Pillow's resize, which returns the image itself when the size is already the one asked.
cv::Mat pil_resized(const cv::Mat& rgb, int w, int h) {
  return rgb.cols == w && rgb.rows == h ? rgb : pil_resize_bicubic(rgb, w, h);
}

// InternVL's dynamic_preprocess: the image resized to the tile grid, its tiles row by row,
// then the thumbnail; stacked as one image of tiles·(S/p) patch rows.
PreparedImage tiles_of(const cv::Mat& rgb, const ImageGeometry& v) {
  const int S = v.image_size;
  image_grid(rgb.rows, rgb.cols, v);  // checks the side
  const TileGrid t = tile_grid(rgb.rows, rgb.cols, v);
  const cv::Mat grid = pil_resized(rgb, t.cols * S, t.rows * S);
  PreparedImage out;
  out.tiles = t.count();
  out.grid_h = out.tiles * (S / v.patch);
  out.grid_w = S / v.patch;
  for (int i = 0; i < t.cols * t.rows; ++i)
    patchify(grid(cv::Rect((i % t.cols) * S, (i / t.cols) * S, S, S)).clone(), v.patch, out.pixels);
  if (t.thumbnail) patchify(pil_resized(rgb, S, S), v.patch, out.pixels);
  return out;
}

}  // namespace

ImageSize read_image_size(const std::string& path, const std::string& root) {
  const InputFile f = open_image(path, root);
  HeaderReader in(f);
  unsigned char sig[12];
  const int64_t n = in.read(sig, 12);
  static constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::equal(sig, sig + 8, kPng)) {
    in.seek(0);
    return png_size(in, path);
  }
  if (n >= 3 && sig[0] == 0xFF && sig[1] == 0xD8 && sig[2] == 0xFF) return jpeg_size(in, path);
  if (is_webp(sig, n)) {
    in.seek(0);
    return webp_size(in, path);
  }
  if (is_gif(sig, n)) throw Error(gif_refusal(path));
  throw Error(fmt::format("image '{}' is not PNG, JPEG or WebP (or its header is truncated)", path));
}

PreparedImage prepare_image(const cv::Mat& bgr, const ImageGeometry& v) {
  DHP_CHECK(bgr.type() == CV_8UC3 && !bgr.empty(),
            "prepare_image: expected a non-empty 8-bit 3-channel BGR image");
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  // Tiling is the resize rule of a tiled tower, whatever model.vision.resize says.
  if (v.tiled()) return tiles_of(rgb, v);
  if (v.resize == ImageFit::pad_square && rgb.rows != rgb.cols) {
    // Centred as PIL's paste at ((side - w) / 2, (side - h) / 2), floored.
    const int side = std::max(rgb.rows, rgb.cols);
    const auto c = v.pad_rgb();
    cv::Mat square(side, side, CV_8UC3, cv::Scalar(c[0], c[1], c[2]));
    rgb.copyTo(square(cv::Rect((side - rgb.cols) / 2, (side - rgb.rows) / 2, rgb.cols, rgb.rows)));
    rgb = square;
  }
  const ImageSize s = resized_size(rgb.rows, rgb.cols, v);
  if (v.resize == ImageFit::clip) {
    // The short side to image_size, the long one int(image_size * long / short) (transformers'
    // get_resize_output_image_size), then the centre crop at ((h - n) / 2, (w - n) / 2), floored.
    const int n = v.image_size;
    const bool wide = rgb.cols > rgb.rows;
    const int shorter = wide ? rgb.rows : rgb.cols, longer = wide ? rgb.cols : rgb.rows;
    const int stretched = int(double(n) * double(longer) / double(shorter));
    const cv::Mat r = pil_resize_bicubic(rgb, wide ? stretched : n, wide ? n : stretched);
    rgb = r(cv::Rect((r.cols - n) / 2, (r.rows - n) / 2, n, n)).clone();
  } else if (v.fixed_square() || v.resize == ImageFit::qwen) {
    if (s.h != rgb.rows || s.w != rgb.cols) rgb = pil_resize_bicubic(rgb, s.w, s.h);
  } else if (s.h != rgb.rows || s.w != rgb.cols) {
    cv::Mat resized;
    cv::resize(rgb, resized, cv::Size(s.w, s.h), 0, 0, cv::INTER_CUBIC);
    rgb = resized;
  }
  PreparedImage out;
  out.grid_h = s.h / v.patch;
  out.grid_w = s.w / v.patch;
  patchify(rgb, v.patch, out.pixels);
  return out;
}

std::vector<uint8_t> read_image_file(const std::string& path, const std::string& root) {
  const InputFile f = open_image(path, root);
  const int64_t size = f.size();
  DHP_CHECK(size <= kMaxImageFileBytes,
            "image '{}' is {} bytes, more than the {} an image file may have", path, size,
            kMaxImageFileBytes);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  DHP_CHECK(f.read_at(bytes.data(), size, 0) == size, "image '{}' could not be read whole", path);
  return bytes;
}

PreparedImage load_image(const std::string& path, const ImageGeometry& v, int64_t max_pixels) {
  const ImageSize s = read_image_size(path);
  DHP_CHECK(max_pixels <= 0 || int64_t(s.h) * s.w <= max_pixels,
            "image '{}' is {}x{} pixels, more than the {} allowed (data.max_image_pixels); "
            "scale it down first",
            path, s.w, s.h, max_pixels);
  const std::vector<uint8_t> bytes = read_image_file(path);
  return prepare_checked(decode_image(bytes.data(), bytes.size(), path), s, path, v);
}

cv::Mat decode_image(const uint8_t* data, size_t n, const std::string& what) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  static constexpr uint8_t kIend[8] = {'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  // Writers may pad after the end marker; a few bytes of slack keep those files usable.
  constexpr size_t kTrailerSlack = 16;
  const size_t tail = n > kTrailerSlack + 8 ? n - kTrailerSlack - 8 : 0;
  if (n >= 8 && std::equal(kPng, kPng + 8, data)) {
    DHP_CHECK(std::search(data + tail, data + n, kIend, kIend + 8) != data + n,
              "image '{}' is truncated (PNG without its IEND chunk)", what);
  } else if (n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
    static constexpr uint8_t kEoi[2] = {0xFF, 0xD9};
    DHP_CHECK(std::search(data + tail, data + n, kEoi, kEoi + 2) != data + n,
              "image '{}' is truncated (JPEG without its end-of-image marker)", what);
  } else if (is_webp(data, int64_t(n))) {
    const uint32_t riff = uint32_t(data[4]) | uint32_t(data[5]) << 8 | uint32_t(data[6]) << 16 | uint32_t(data[7]) << 24;
    DHP_CHECK(uint64_t(riff) + 8 <= n, "image '{}' is truncated (WebP of {} bytes, its RIFF header says {})", what,
              n, uint64_t(riff) + 8);
  } else if (is_gif(data, int64_t(n))) {
    throw Error(gif_refusal(what));
  } else {
    throw Error(fmt::format("image '{}' is not PNG, JPEG or WebP", what));
  }
  cv::Mat bgr = codecs::decode_image(data, n, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  DHP_CHECK(!bgr.empty(), "image '{}' cannot be decoded (corrupt data)", what);
  return bgr;
}

PreparedImage prepare_checked(const cv::Mat& bgr, ImageSize expected, const std::string& what,
                              const ImageGeometry& v) {
  DHP_CHECK(!bgr.empty(), "image '{}' cannot be decoded (corrupt or truncated data)", what);
  DHP_CHECK(bgr.rows == expected.h && bgr.cols == expected.w,
            "image '{}' decodes to {}x{} but its header says {}x{}", what, bgr.rows, bgr.cols,
            expected.h, expected.w);
  return prepare_image(bgr, v);
}

void blank(PreparedImage& im, std::array<uint8_t, 3> rgb) {
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = rgb[i % 3];
}

}  // namespace dhp
