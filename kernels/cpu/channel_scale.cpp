#include "kernels/cpu/channel_scale.h"

namespace dhp::cpu {

void channel_scale_forward(float* y, const float* x, const float* w, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) y[t * C + c] = x[t * C + c] * w[c];
}

void channel_scale_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                            int64_t T, int64_t C) {
  // The weight's gradient first: dx may alias dy. One thread per column, rows in order (in
  // double): deterministic whatever the thread count.
  if (dw) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      double s = 0.0;
      for (int64_t t = 0; t < T; ++t) s += double(dy[t * C + c]) * double(x[t * C + c]);
      dw[c] += float(s);
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) dx[t * C + c] = dy[t * C + c] * w[c];
}

}  // namespace dhp::cpu
