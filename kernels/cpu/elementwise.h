// Small vector operations the model and optimizer need.
#pragma once

#include <cstdint>

namespace dhp::cpu {

void add_inplace(float* y, const float* x, int64_t n);   // y += x
void scale_inplace(float* y, float s, int64_t n);        // y *= s
// Sum of squares in double, in a fixed order independent of the thread count.
double sum_squares(const float* x, int64_t n);

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t t;  // 1-based step for bias correction
};
// Decoupled weight decay: p -= lr·(m̂ / (sqrt(v̂) + eps) + wd·p); wd = 0 for undecayed params.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s);

}  // namespace dhp::cpu
