#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace dhp::cpu {
namespace {

void rotate(float* x, const int32_t* pos, int64_t T, int H, int hd, int offset, int span,
            const RopeSpec& rope, float sign) {
  const int half = span / 2;
  std::vector<double> inv_freq(half);  // (half)
  for (int i = 0; i < half; ++i) inv_freq[i] = rope_pair_freq(rope, i, span);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      // Angles in double: positions reach 1e5 and float loses the phase there.
      double a = double(rope_position(rope, pos, t, i)) * inv_freq[i];
      float c = float(std::cos(a)), s = sign * float(std::sin(a));
      for (int h = 0; h < H; ++h) {
        float* v = x + (t * H + h) * hd + offset;
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* pos, int64_t T, int H, int hd, int offset, int span,
                  const RopeSpec& rope) {
  rotate(x, pos, T, H, hd, offset, span, rope, 1.0f);
}

void rope_backward(float* dx, const int32_t* pos, int64_t T, int H, int hd, int offset, int span,
                   const RopeSpec& rope) {
  rotate(dx, pos, T, H, hd, offset, span, rope, -1.0f);
}

void rope2d_forward(float* x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                    const RopeSpec& rope) {
  rotate(x, row, T, H, hd, 0, hd / 2, rope, 1.0f);
  rotate(x, col, T, H, hd, hd / 2, hd / 2, rope, 1.0f);
}

void rope2d_backward(float* dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                     const RopeSpec& rope) {
  rotate(dx, row, T, H, hd, 0, hd / 2, rope, -1.0f);
  rotate(dx, col, T, H, hd, hd / 2, hd / 2, rope, -1.0f);
}

}  // namespace dhp::cpu
