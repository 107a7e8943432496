#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dhp::cpu {

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

double sum_squares(const float* x, int64_t n) {
  // Fixed-size chunks summed in chunk order: the result does not depend on how many threads
  // ran, which keeps the clipped update (and resumed runs) bit-identical.
  constexpr int64_t kChunk = 1 << 14;
  int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) s += double(x[i]) * x[i];
    part[c] = s;
  }
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.t));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.t));
  const float step = float(s.lr / bc1);
  const float inv_bc2 = float(1.0 / bc2);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g[i];
    v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g[i] * g[i];
    float denom = std::sqrt(v[i] * inv_bc2) + s.eps;
    p[i] -= step * m[i] / denom + s.lr * s.weight_decay * p[i];
  }
}

}  // namespace dhp::cpu

namespace dhp::cpu {

void fill(float* y, float value, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = value;
}

void scatter_rows(float* y, const float* src, const int32_t* slot, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    if (slot[t] >= 0) std::copy_n(src + int64_t(slot[t]) * C, C, y + t * C);
}

void gather_rows(float* dsrc, const float* dy, const int32_t* slot, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    if (slot[t] >= 0) std::copy_n(dy + t * C, C, dsrc + int64_t(slot[t]) * C);
}

}  // namespace dhp::cpu
