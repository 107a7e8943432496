#include "kernels/cpu/pixels.h"

namespace dhp::cpu {

void normalize_pixels(float* y, const uint8_t* pixels, int64_t n, const PixelNorm& norm) {
  // The formula evaluated literally in fp32, once per (channel, value); the device evaluates
  // the same IEEE operations per pixel, so both give the same bits.
  float lut[3][256];
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 256; ++i) lut[c][i] = (float(i) / 255.0f - norm.mean[c]) / norm.std[c];
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = lut[i % 3][pixels[i]];
}

}  // namespace dhp::cpu
