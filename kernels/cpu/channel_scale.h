// LayerScale (InternViT's ls1/ls2, Hugging Face's lambda_1/lambda_2): each column of a branch's
// output scaled by its own weight before the residual add, y[t, c] = x[t, c] · w[c].
// Gradient convention: dw accumulates (null for a frozen parameter), dx is written.
#pragma once

#include <cstdint>

namespace dhp::cpu {

// x, y (T, C), w (C); y may alias x.
void channel_scale_forward(float* y, const float* x, const float* w, int64_t T, int64_t C);
// dx = dy · w; dw += sum over rows of dy · x. dx may alias dy.
void channel_scale_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                            int64_t T, int64_t C);

}  // namespace dhp::cpu
