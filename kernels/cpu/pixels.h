// Pixel normalisation (model-spec.md, "Image preprocessing"): 8-bit RGB pixels to the vision
// encoder's input, y = (x / 255 - mean[c]) / std[c] with c = i % 3, in fp32.
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cpu {

void normalize_pixels(float* y, const uint8_t* pixels, int64_t n, const PixelNorm& norm);

}  // namespace dhp::cpu
