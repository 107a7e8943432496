// RMSNorm: y = x / sqrt(mean(x²) + eps) · w. Gradient convention: dw accumulates, dx is written.
#pragma once

#include <cstdint>

namespace dhp::cpu {

// model-spec.md's eps: the vision encoder's, and the decoder's unless model.rms_norm_eps says
// otherwise.
constexpr float kRmsEps = 1e-6f;

// x, y (T, C); w (C); rstd (T) saved for the backward pass.
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t T, int64_t C,
                     float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t C);

}  // namespace dhp::cpu
