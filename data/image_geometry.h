// What the data path needs of the model: how images are resized and cut into patches
// (model-spec.md, "Image preprocessing"). The model's vision config extends it
// (model/config.h); data/ knows nothing else of the model.
#pragma once

#include <cstdint>

namespace dhp {

struct ImageGeometry {
  int patch = 14;            // p: patch side in pixels
  int merge = 2;             // m in {1, 2}
  int64_t min_pixels = 16 * 16;
  int64_t max_pixels = 256 * 256;

  int factor() const { return patch * merge; }  // f = p * m: resized sides are multiples of it
  int64_t patch_numel() const { return int64_t(patch) * patch * 3; }
};

}  // namespace dhp
