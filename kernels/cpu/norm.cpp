#include "kernels/cpu/norm.h"

#include <cmath>

namespace dhp::cpu {

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t T, int64_t C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += double(xt[c]) * xt[c];
    float r = 1.0f / std::sqrt(float(ss / C) + eps);
    rstd[t] = r;
    float* yt = y + t * C;
    for (int64_t c = 0; c < C; ++c) yt[c] = xt[c] * r * w[c];
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t C) {
  // With g = w·dy and n = x·rstd:  dx = rstd · (g - n · mean(g·n)).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C;
    const float* dyt = dy + t * C;
    float r = rstd[t];
    double dot = 0.0;
    for (int64_t c = 0; c < C; ++c) dot += double(w[c]) * dyt[c] * xt[c] * r;
    float mean = float(dot / C);
    float* dxt = dx + t * C;
    for (int64_t c = 0; c < C; ++c) dxt[c] = r * (w[c] * dyt[c] - xt[c] * r * mean);
  }
  if (!dw) return;  // a frozen weight
  // Columns are independent: one thread per column block, rows in order.
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    float s = 0.0f;
    for (int64_t t = 0; t < T; ++t) s += dy[t * C + c] * x[t * C + c] * rstd[t];
    dw[c] += s;
  }
}

}  // namespace dhp::cpu
