// bf16 on the host: the upper half of an fp32 word, rounded to nearest even. The CPU's bf16
// storage (kernels/cpu/staged_ops.h) and the tests of the CUDA kernels use these.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace dhp {

inline uint16_t bf16_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return uint16_t((u >> 16) | 0x0040u);  // NaN stays NaN (quiet)
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// x rounded to the nearest bf16, as fp32.
inline float bf16_round(float x) { return bf16_to_float(bf16_from_float(x)); }

// n values widened to fp32, and rounded to bf16 (threads share long arrays).
inline void widen_bf16(float* y, const uint16_t* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}
inline void round_to_bf16(uint16_t* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_from_float(x[i]);
}
inline std::vector<float> widen_bf16(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  widen_bf16(y.data(), x.data(), int64_t(x.size()));
  return y;
}
inline std::vector<uint16_t> round_to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  round_to_bf16(y.data(), x.data(), int64_t(x.size()));
  return y;
}

}  // namespace dhp
