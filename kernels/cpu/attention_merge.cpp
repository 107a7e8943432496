#include "kernels/cpu/attention_merge.h"

#include <cmath>
#include <limits>

namespace dhp::cpu {

void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse,
                     int64_t T, int H, int hd) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float& a = lse[int64_t(h) * T + t];
      const float b = part_lse[int64_t(h) * T + t];
      if (b == kNegInf) continue;
      float* o = out + (t * H + h) * hd;
      const float* p = part_out + (t * H + h) * hd;
      if (a == kNegInf) {
        for (int i = 0; i < hd; ++i) o[i] = p[i];
        a = b;
        continue;
      }
      const float m = std::max(a, b);
      const float wa = std::exp(a - m), wb = std::exp(b - m), s = wa + wb;
      for (int i = 0; i < hd; ++i) o[i] = (wa * o[i] + wb * p[i]) / s;
      a = m + std::log(s);
    }
}

}  // namespace dhp::cpu
