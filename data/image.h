// Image preprocessing of model-spec.md: header-only size probing, the resize rule, and the
// resized 8-bit pixels cut into patches in the layout the vision encoder reads (the model
// normalises them on its device: Ops::normalize_pixels).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "types/image_geometry.h"
#include "types/image_span.h"

namespace cv {
class Mat;
}

namespace dhp {

struct ImageSize {
  int h = 0, w = 0;
};

// The spec's resize rule, to the letter: both sides become multiples of f = patch * merge.
// Under resize = pad_square every image becomes image_size x image_size.
ImageSize resized_size(int H, int W, const ImageGeometry& v);

// The merged-token grid of an H x W image after resized_size: (h/p/m) x (w/p/m); its decoder
// tokens are their product. A tiled image's tiles stack vertically: (tiles·s) x s, s =
// image_size/p/m.
MergedGrid image_grid(int H, int W, const ImageGeometry& v);
// The tower's images an image of merged grid `g` (image_grid) becomes: its tiles, or 1.
inline int encoder_images(const MergedGrid& g, const ImageGeometry& v) { return v.tiled() ? g.rows / g.cols : 1; }
inline int64_t image_tokens(int H, int W, const ImageGeometry& v) { return image_grid(H, W, v).tokens(); }

// Reads only the PNG IHDR or JPEG SOFn header (no pixel decode). Throws dhp::Error naming the
// file for a missing file, one that is not a regular file (a FIFO would block the open
// forever, a device would never end), another format, or a truncated or malformed header.
// A `path` inside the folder `root` is opened without leaving it: a symlink or ".." that
// leads out of `root` is an error (core/input.h).
ImageSize read_image_size(const std::string& path, const std::string& root = "");

// Largest image file read whole: far beyond any photo, small enough that a wrong path cannot
// make a reader allocate without bound.
inline constexpr int64_t kMaxImageFileBytes = int64_t(1) << 30;

// The bytes of an image file: regular files only, at most kMaxImageFileBytes, confined to
// `root` as read_image_size is. Throws dhp::Error naming the file otherwise.
std::vector<uint8_t> read_image_file(const std::string& path, const std::string& root = "");

struct PreparedImage {
  int grid_h = 0, grid_w = 0;   // patches per column / per row
  int frames = 1;               // a video's frame pair: 2, the frames one after the other
  int tiles = 1;                // InternVL's tiles stacked vertically, grid_h / tiles rows each
                                // (each its own image of the tower)
  std::vector<uint8_t> pixels;  // (frames*grid_h*grid_w, p*p*3) row-major over the grid;
                                // inside a patch the index is (dy*p+dx)*3+c, c in R,G,B
  int64_t n_patches() const { return int64_t(grid_h) * grid_w; }
};

// bgr: CV_8UC3 as OpenCV decodes it. Converts to RGB, resizes (INTER_CUBIC on uint8) only
// when the size changes, and patchifies. Under pad_square the image is first centred on a
// square of its longer side filled with pad_rgb() (LLaVA-1.5's expand2square). A tiled
// geometry gives the image's tiles (tile_grid), stacked.
PreparedImage prepare_image(const cv::Mat& bgr, const ImageGeometry& v);
// Decodes the file (ignoring EXIF orientation, so the size matches read_image_size) and
// prepares it. The header is read first and an image of more than max_pixels (H*W) pixels is
// refused before the decoder allocates anything. Throws dhp::Error naming the file when it is
// missing, too large or cannot be decoded.
PreparedImage load_image(const std::string& path, const ImageGeometry& v, int64_t max_pixels);
// Decodes encoded PNG / JPEG bytes to BGR (EXIF orientation ignored, so the size matches the
// header). Throws dhp::Error naming `what` for another format, a file cut short (no JPEG
// end-of-image marker or PNG IEND chunk: decoders would silently fill the missing rows with
// grey) or data the decoder rejects.
cv::Mat decode_image(const uint8_t* data, size_t n, const std::string& what);
// Prepares an image that was decoded (cv::imread / cv::imdecode) from a source whose header
// said `expected`: an empty Mat (undecodable data) or a different size throws dhp::Error
// naming `what`, because the stored length would no longer describe the pixels.
PreparedImage prepare_checked(const cv::Mat& bgr, ImageSize expected, const std::string& what,
                              const ImageGeometry& v);
// Replaces every pixel by the mean colour (the 8-bit value nearest the tower's mean,
// ImageGeometry::mean_rgb: within 0.5/255/std of 0 after normalisation), keeping the grid, so
// a model can be evaluated without seeing the image while the sequence stays the same.
void blank(PreparedImage& im, std::array<uint8_t, 3> rgb = ImageGeometry{}.mean_rgb());

}  // namespace dhp
