// Pointwise activations on the device (kernels/cpu/activation.h is the reference: SwiGLU's
// silu gate and the tanh form of GELU). Gradients of inputs are written (=).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dhp::cuda {

void swiglu_forward(cudaStream_t stream, float* h, const float* a, const float* b, int64_t n);
// da may alias dh.
void swiglu_backward(cudaStream_t stream, float* da, float* db, const float* dh, const float* a,
                     const float* b, int64_t n);
void gelu_forward(cudaStream_t stream, float* y, const float* x, int64_t n);
void gelu_backward(cudaStream_t stream, float* dx, const float* dy, const float* x, int64_t n);

}  // namespace dhp::cuda
