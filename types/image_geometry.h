// What the data path needs of the model: how images are resized and cut into patches
// (model-spec.md, "Image preprocessing"). The model's vision config extends it
// (model/config.h); data/ knows nothing else of the model.
#pragma once

#include <cstdint>

namespace dhp {

// The spec's per-channel normalisation, (x / 255 - mean) / std for R, G, B; applied on the
// device by the model (Ops::normalize_pixels), so batches carry 8-bit pixels.
inline constexpr float kPixelMean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
inline constexpr float kPixelStd[3] = {0.26862954f, 0.26130258f, 0.27577711f};

struct ImageGeometry {
  int patch = 14;            // p: patch side in pixels
  int merge = 2;             // m in {1, 2}
  int64_t min_pixels = 16 * 16;
  int64_t max_pixels = 256 * 256;

  int factor() const { return patch * merge; }  // f = p * m: resized sides are multiples of it
  int64_t patch_numel() const { return int64_t(patch) * patch * 3; }
};

}  // namespace dhp
