// LayerNorm with weight and bias, as Hugging Face's nn.LayerNorm (CLIP and SigLIP towers):
// y = (x - mean) · rstd · w + b, rstd = 1 / sqrt(var + eps), var the biased variance over C.
// Gradient convention: dw and db accumulate (null for a frozen parameter), dx is written.
#pragma once

#include <cstdint>

namespace dhp::cpu {

// x, y (T, C); w, b (C); mean and rstd (T) saved for the backward pass.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t T, int64_t C, float eps);
// dx may alias dy.
void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t T,
                        int64_t C);

}  // namespace dhp::cpu
