// What the data path needs of the model: how images are resized and cut into patches
// (model-spec.md, "Image preprocessing"), and the per-channel constants a tower normalises
// pixels by (the colour a pad or a blanked image takes). The model's vision config extends it
// (types/model_config.h); data/ knows nothing else of the model.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstdint>
#include <string_view>
#include <utility>

namespace dhp {

// The spec's per-channel normalisation, (x / 255 - mean) / std for R, G, B; applied on the
// device by the model (Ops::normalize_pixels), so batches carry 8-bit pixels. CLIP's constants
// (the native tower's and CLIP's); SigLIP towers use 0.5 for both.
inline constexpr std::array<double, 3> kClipPixelMean = {0.48145466, 0.4578275, 0.40821073};
inline constexpr std::array<double, 3> kClipPixelStd = {0.26862954, 0.26130258, 0.27577711};
inline constexpr std::array<double, 3> kSiglipPixelMean = {0.5, 0.5, 0.5};
inline constexpr std::array<double, 3> kSiglipPixelStd = {0.5, 0.5, 0.5};
// ImageNet's (InternVL's processors).
inline constexpr std::array<double, 3> kImagenetPixelMean = {0.485, 0.456, 0.406};
inline constexpr std::array<double, 3> kImagenetPixelStd = {0.229, 0.224, 0.225};

// How an image becomes the pixels the tower sees (model.vision.resize).
//   native:     model-spec.md's rule: both sides to multiples of patch·merge within
//               [min_pixels, max_pixels], keeping the aspect ratio (resized_size).
// The other three are Hugging Face's image processors, pixel for pixel (Pillow's bicubic,
// data/resample.h), each giving image_size x image_size; min_pixels and max_pixels do not apply.
//   clip:       CLIPImageProcessor: the short side to image_size (the long side
//               int(image_size · long / short)), then a centre crop of image_size x image_size.
//   siglip:     SiglipImageProcessor: resized to image_size x image_size, the aspect ratio lost.
//   pad_square: LLaVA-1.5's image_aspect_ratio "pad" (expand2square): the image is centred on a
//               square of its longer side filled with the mean colour (pad_rgb), then resized
//               to image_size x image_size, as the CLIP processor does a square.
//   qwen:       Qwen2VLImageProcessor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): each image at its own
//               resolution by transformers' smart_resize to multiples of patch·merge within
//               [min_pixels, max_pixels] (Python's round, half to even; no clamp beyond it;
//               an aspect ratio above 200 refused), then Pillow's bicubic.
enum class ImageFit : uint8_t { native, pad_square, clip, siglip, qwen };
inline constexpr std::pair<ImageFit, std::string_view> kImageFitNames[] = {
    {ImageFit::native, "native"}, {ImageFit::pad_square, "pad_square"}, {ImageFit::clip, "clip"},
    {ImageFit::siglip, "siglip"}, {ImageFit::qwen, "qwen"}};
inline std::string_view image_fit_name(ImageFit f) {
  for (const auto& [value, name] : kImageFitNames)
    if (value == f) return name;
  return "?";
}

struct ImageGeometry {
  int patch = 14;            // p: patch side in pixels
  int merge = 2;             // m in {1, 2}
  int64_t min_pixels = 16 * 16;
  int64_t max_pixels = 256 * 256;
  ImageFit resize = ImageFit::native;
  // The pretrained image side of a clip / siglip tower (its position grid is image_size /
  // patch) and the square side every image becomes under pad_square, clip and siglip; 0 for
  // the native tower.
  int image_size = 0;
  std::array<double, 3> pixel_mean = kClipPixelMean;
  std::array<double, 3> pixel_std = kClipPixelStd;
  // A video's frames per encoder image: 1, or a tower's temporal patch (Qwen3-VL's 2: a video's
  // frames go in pairs, each pair one image of two frames after one timestamp). Set from the
  // tower's row by data_geometry (types/model_config.h), not a key.
  int video_frames_per_image = 1;
  // InternVL's dynamic tiling (max_tiles > 0; model.vision.max_tiles, -1: the tower row's):
  // each image becomes a grid of image_size x image_size tiles, the grid of min_tiles ..
  // max_tiles tiles whose columns / rows is nearest the image's width / height, cut from the
  // image resized to fill it, row by row; then, with thumbnail and more than one tile, the whole
  // image at image_size (InternVL's dynamic_preprocess; Pillow's bicubic throughout). Each tile
  // is an image of the tower; one image's tiles share one <img> ... </img>.
  int min_tiles = 1;
  int max_tiles = -1;
  bool thumbnail = true;
  bool tiled() const { return max_tiles > 0; }
  // How each of a sample's `images` image files is tiled: InternVL's fine-tuning shares
  // max_tiles among them (max(1, max_tiles / images)).
  ImageGeometry for_images(int64_t images) const {
    ImageGeometry g = *this;
    if (tiled() && images > 1) g.max_tiles = std::max<int64_t>(1, max_tiles / images), g.min_tiles = std::min(min_tiles, g.max_tiles);
    return g;
  }
  // How a video frame is prepared: as an image, except that a tiled tower takes each frame as
  // one tile (InternVL's video frames: dynamic_preprocess with max_num 1, the frame resized to
  // image_size x image_size).
  ImageGeometry frame_geometry() const {
    ImageGeometry g = *this;
    if (tiled()) g.max_tiles = 0, g.resize = ImageFit::siglip;
    return g;
  }

  int factor() const { return patch * merge; }  // f = p * m: resized sides are multiples of it
  // Every image becomes image_size x image_size (the square processors' modes), whatever its
  // size; native and qwen keep each image's own resolution.
  bool fixed_square() const { return resize != ImageFit::native && resize != ImageFit::qwen; }
  int64_t patch_numel() const { return int64_t(patch) * patch * 3; }
  // The 8-bit colour nearest the mean: blanked images take it, so it normalises to within
  // 0.5/255/std of zero.
  std::array<uint8_t, 3> mean_rgb() const { return mean_bytes(0.5); }
  // pad_square's fill: LLaVA's expand2square background, int(mean * 255) (truncated: CLIP's
  // mean gives (122, 116, 104), SigLIP's 127), so padded images match its preprocessing.
  std::array<uint8_t, 3> pad_rgb() const { return mean_bytes(0.0); }

 private:
  // 255 * mean per channel, plus `offset` (0.5 rounds to nearest, 0 truncates), clamped.
  std::array<uint8_t, 3> mean_bytes(double offset) const {
    std::array<uint8_t, 3> c{};
    for (int i = 0; i < 3; ++i) {
      const double v = pixel_mean[size_t(i)] * 255.0;
      c[size_t(i)] = uint8_t(v <= 0.0 ? 0 : v >= 255.0 ? 255 : int(v + offset));
    }
    return c;
  }
};

// InternVL's tiling of an H x W image (ImageGeometry::tiled, H, W >= 1, 1 <= min_tiles <=
// max_tiles): the grid of image_size tiles (columns, rows) and whether the thumbnail follows
// them. As InternVL's dynamic_preprocess: of the grids of min_tiles..max_tiles tiles, taken by
// tile count, the one whose columns / rows is nearest W / H; on a tie the later one while the
// image's area exceeds half the grid's. Python's float division and comparisons in the same
// order: the same choice to the bit.
struct TileGrid {
  int cols = 1, rows = 1;
  bool thumbnail = false;
  int count() const { return cols * rows + (thumbnail ? 1 : 0); }
};
inline TileGrid tile_grid(int H, int W, const ImageGeometry& v) {
  const double aspect = double(W) / double(H), area = double(W) * double(H), side = v.image_size;
  double best_diff = std::numeric_limits<double>::infinity();
  TileGrid best;
  for (int n = v.min_tiles; n <= v.max_tiles; ++n)  // by tile count, as sorted() leaves them
    for (int c = 1; c <= n; ++c) {
      if (n % c) continue;
      const int r = n / c;
      const double diff = std::abs(aspect - double(c) / double(r));
      if (diff < best_diff) {
        best_diff = diff;
        best = {c, r, false};
      } else if (diff == best_diff && area > 0.5 * side * side * c * r) {
        best = {c, r, false};
      }
    }
  best.thumbnail = v.thumbnail && best.cols * best.rows > 1;
  return best;
}

}  // namespace dhp
