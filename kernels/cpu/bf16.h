// bf16 on the host: the upper half of an fp32 word, rounded to nearest even. The CPU's bf16
// storage (kernels/cpu/staged_ops.h) and the tests of the CUDA kernels use these.
#pragma once

#include <cstdint>
#include <cstring>

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

}  // namespace dhp
