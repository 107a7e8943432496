#include "kernels/cpu/layernorm.h"

#include <cmath>

namespace dhp::cpu {

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t T, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C;
    // Two passes in double: the variance of values far from zero keeps its digits.
    double s = 0.0;
    for (int64_t c = 0; c < C; ++c) s += xt[c];
    const double mu = s / double(C);
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += (xt[c] - mu) * (xt[c] - mu);
    const float m = float(mu);
    const float r = 1.0f / std::sqrt(float(ss / double(C)) + eps);
    mean[t] = m;
    rstd[t] = r;
    float* yt = y + t * C;
    for (int64_t c = 0; c < C; ++c) yt[c] = (xt[c] - m) * r * w[c] + b[c];
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t T,
                        int64_t C) {
  // The parameter gradients first: dx may alias dy. Columns are independent: one thread per
  // column block, rows in order, so the sums do not depend on the thread count.
  if (dw || db) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      float sw = 0.0f, sb = 0.0f;
      for (int64_t t = 0; t < T; ++t) {
        const float g = dy[t * C + c];
        sw += g * ((x[t * C + c] - mean[t]) * rstd[t]);
        sb += g;
      }
      if (dw) dw[c] += sw;
      if (db) db[c] += sb;
    }
  }
  // With g = w·dy and n = (x - mean)·rstd:  dx = rstd · (g - mean(g) - n · mean(g·n)).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C;
    const float* dyt = dy + t * C;
    const float m = mean[t], r = rstd[t];
    double sg = 0.0, sgn = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double g = double(w[c]) * dyt[c];
      sg += g;
      sgn += g * ((xt[c] - m) * r);
    }
    const float mg = float(sg / double(C)), mgn = float(sgn / double(C));
    float* dxt = dx + t * C;
    for (int64_t c = 0; c < C; ++c)
      dxt[c] = r * (w[c] * dyt[c] - mg - (xt[c] - m) * r * mgn);
  }
}

}  // namespace dhp::cpu
