#include "kernels/cuda/activation.h"
#include "kernels/cuda/activation_kernels.cuh"
#include "kernels/cuda/check.h"

namespace dhp::cuda {
namespace {

__global__ void swiglu_forward_kernel(float* h, const float* a, const float* b, int64_t n) {
  act::swiglu_forward_block(h, a, b, n);
}

__global__ void swiglu_backward_kernel(float* da, float* db, const float* dh, const float* a,
                                       const float* b, int64_t n) {
  act::swiglu_backward_block(da, db, dh, a, b, n);
}

__global__ void gelu_forward_kernel(float* y, const float* x, int64_t n) {
  act::gelu_forward_block(y, x, n);
}

__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  act::gelu_backward_block(dx, dy, x, n);
}

}  // namespace

void swiglu_forward(cudaStream_t stream, float* h, const float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  swiglu_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(h, a, b, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(cudaStream_t stream, float* da, float* db, const float* dh, const float* a,
                     const float* b, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  swiglu_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(da, db, dh, a, b, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void gelu_forward(cudaStream_t stream, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  gelu_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(y, x, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void gelu_backward(cudaStream_t stream, float* dx, const float* dy, const float* x, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  gelu_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(dx, dy, x, n);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
