#include "kernels/cuda/check.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/norm_kernels.cuh"

namespace dhp::cuda {
namespace {

__global__ void rmsnorm_forward_kernel(float* y, float* rstd, const float* x, const float* w,
                                       int64_t C) {
  __shared__ float shared[norm::kRowSharedFloats];
  norm::forward_block(y, rstd, x, w, C, shared);
}

__global__ void rmsnorm_dx_kernel(float* dx, const float* dy, const float* x, const float* w,
                                  const float* rstd, int64_t C) {
  __shared__ float shared[norm::kRowSharedFloats];
  norm::dx_block(dx, dy, x, w, rstd, C, shared);
}

__global__ void rmsnorm_dw_kernel(float* dw, const float* dy, const float* x, const float* rstd,
                                  int64_t T, int64_t C) {
  __shared__ norm::DwShared part;
  norm::dw_block(dw, dy, x, rstd, T, C, part);
}

}  // namespace

void rmsnorm_forward(cudaStream_t stream, float* y, float* rstd, const float* x, const float* w,
                     int64_t T, int64_t C) {
  if (T <= 0) return;
  const LaunchDims l = norm::rows_launch(T);
  rmsnorm_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(y, rstd, x, w, C);
  DHP_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(cudaStream_t stream, float* dx, float* dw, const float* dy, const float* x,
                      const float* w, const float* rstd, int64_t T, int64_t C) {
  if (T <= 0) return;
  // dw first: dx may alias dy (the model reuses gradient buffers).
  const LaunchDims ldw = norm::dw_launch(C);
  rmsnorm_dw_kernel<<<ldw.grid(), ldw.block(), 0, stream>>>(dw, dy, x, rstd, T, C);
  DHP_CUDA_CHECK_LAUNCH();
  const LaunchDims ldx = norm::rows_launch(T);
  rmsnorm_dx_kernel<<<ldx.grid(), ldx.block(), 0, stream>>>(dx, dy, x, w, rstd, C);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
