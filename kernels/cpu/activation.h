// Pointwise activations. Gradients of inputs are written (=).
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cpu {

// SwiGLU gate: h = silu(a) · b, silu(a) = a · sigmoid(a). a, b, h (n).
void swiglu_forward(float* h, const float* a, const float* b, int64_t n);
void swiglu_backward(float* da, float* db, const float* dh, const float* a, const float* b,
                     int64_t n);

// The GELU family (kernels/op_types.h GeluKind has the formulas). x, y (n); dx may alias dy.
void gelu_forward(float* y, const float* x, int64_t n, GeluKind k);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, GeluKind k);

}  // namespace dhp::cpu
