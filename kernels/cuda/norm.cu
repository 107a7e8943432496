#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm_kernels.cuh"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void rmsnorm_forward_kernel(S* y, float* rstd, const S* x, const S* w, int64_t T, int64_t C,
                                       float eps) {
  __shared__ float shared[norm::kRowSharedFloats];
  norm::forward_block(y, rstd, x, w, T, C, eps, shared);
}

template <class S>
__global__ void rmsnorm_dx_kernel(S* dx, const S* dy, const S* x, const S* w, const float* rstd,
                                  int64_t T, int64_t C) {
  __shared__ float shared[norm::kRowSharedFloats];
  norm::dx_block(dx, dy, x, w, rstd, T, C, shared);
}

template <class S>
__global__ void rmsnorm_dw_kernel(float* dw, float* partial, const S* dy, const S* x, const float* rstd,
                                  int64_t T, int64_t C) {
  __shared__ norm::DwShared part;
  norm::dw_block(dw, partial, dy, x, rstd, T, C, part);
}

__global__ void rmsnorm_dw_finish_kernel(float* dw, const float* partial, int slices, int64_t C) {
  norm::dw_finish(dw, partial, slices, C);
}

}  // namespace

template <class S>
void rmsnorm_forward(cudaStream_t stream, S* y, float* rstd, const S* x, const S* w, int64_t T,
                     int64_t C, float eps) {
  if (T <= 0) return;
  const LaunchDims l = norm::rows_launch(T, C);
  rmsnorm_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(y, rstd, x, w, T, C, eps);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void rmsnorm_backward(cudaStream_t stream, S* dx, float* dw, float* partial, const S* dy, const S* x,
                      const S* w, const float* rstd, int64_t T, int64_t C) {
  if (T <= 0) return;
  // dw first: dx may alias dy (the model reuses gradient buffers).
  if (dw) {  // null for a frozen weight
    const LaunchDims ldw = norm::dw_launch(T, C);
    rmsnorm_dw_kernel<<<ldw.grid(), ldw.block(), 0, stream>>>(dw, partial, dy, x, rstd, T, C);
    DHP_CUDA_CHECK_LAUNCH();
    if (ldw.grid_y > 1) {
      const LaunchDims lf = norm::dw_finish_launch(C);
      rmsnorm_dw_finish_kernel<<<lf.grid(), lf.block(), 0, stream>>>(dw, partial, int(ldw.grid_y), C);
      DHP_CUDA_CHECK_LAUNCH();
    }
  }
  const LaunchDims ldx = norm::rows_launch(T, C);
  rmsnorm_dx_kernel<<<ldx.grid(), ldx.block(), 0, stream>>>(dx, dy, x, w, rstd, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_NORM_INSTANCES(S)                                                                  \
  template void rmsnorm_forward<S>(cudaStream_t, S*, float*, const S*, const S*, int64_t,     \
                                   int64_t, float);                                           \
  template void rmsnorm_backward<S>(cudaStream_t, S*, float*, float*, const S*, const S*,     \
                                    const S*, const float*, int64_t, int64_t);
DHP_NORM_INSTANCES(float)
DHP_NORM_INSTANCES(bf16)
#undef DHP_NORM_INSTANCES

}  // namespace dhp::cuda
