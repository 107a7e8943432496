// Pointwise activations on the device (kernels/cpu/activation.h is the reference: SwiGLU's
// silu gate and the tanh form of GELU). Gradients of inputs are written (=).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/storage.cuh"

namespace dhp::cuda {

// S: the storage, float or bf16 (kernels/cuda/storage.cuh).
template <class S>
void swiglu_forward(cudaStream_t stream, S* h, const S* a, const S* b, int64_t n);
// da may alias dh.
template <class S>
void swiglu_backward(cudaStream_t stream, S* da, S* db, const S* dh, const S* a,
                     const S* b, int64_t n);
template <class S>
void gelu_forward(cudaStream_t stream, S* y, const S* x, int64_t n);
template <class S>
void gelu_backward(cudaStream_t stream, S* dx, const S* dy, const S* x, int64_t n);

}  // namespace dhp::cuda
