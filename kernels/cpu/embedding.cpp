#include "kernels/cpu/embedding.h"

#include <cstring>

namespace dhp::cpu {

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0)
      std::memset(out + t * C, 0, sizeof(float) * C);
    else
      std::memcpy(out + t * C, table + int64_t(ids[t]) * C, sizeof(float) * C);
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T, int64_t C) {
  // Threads own disjoint column ranges and visit rows in order, so repeated ids add up in the
  // same order on every run.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    int64_t c1 = c0 + 16 < C ? c0 + 16 : C;
    for (int64_t t = 0; t < T; ++t) {
      if (ids[t] < 0) continue;
      float* d = dtable + int64_t(ids[t]) * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += dout[t * C + c];
    }
  }
}

}  // namespace dhp::cpu
