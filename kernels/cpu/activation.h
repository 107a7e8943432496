// Pointwise activations. Gradients of inputs are written (=).
#pragma once

#include <cstdint>

namespace dhp::cpu {

// SwiGLU gate: h = silu(a) · b, silu(a) = a · sigmoid(a). a, b, h (n).
void swiglu_forward(float* h, const float* a, const float* b, int64_t n);
void swiglu_backward(float* da, float* db, const float* dh, const float* a, const float* b,
                     int64_t n);

// GELU, tanh form: 0.5·x·(1 + tanh(sqrt(2/pi)·(x + 0.044715·x³))). x, y (n).
void gelu_forward(float* y, const float* x, int64_t n);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);

}  // namespace dhp::cpu
