#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layernorm_kernels.cuh"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void layernorm_forward_kernel(S* y, float* mean, float* rstd, const S* x, const S* w,
                                         const S* b, int64_t C, float eps) {
  __shared__ float shared[layernorm::kRowSharedFloats];
  layernorm::forward_block(y, mean, rstd, x, w, b, C, eps, shared);
}

template <class S>
__global__ void layernorm_dx_kernel(S* dx, const S* dy, const S* x, const S* w,
                                    const float* mean, const float* rstd, int64_t C) {
  __shared__ float shared[layernorm::kRowSharedFloats];
  layernorm::dx_block(dx, dy, x, w, mean, rstd, C, shared);
}

template <class S>
__global__ void layernorm_params_kernel(float* dw, float* db, const S* dy, const S* x,
                                        const float* mean, const float* rstd, int64_t T,
                                        int64_t C) {
  __shared__ layernorm::ParamShared part;
  layernorm::params_block(dw, db, dy, x, mean, rstd, T, C, part);
}

}  // namespace

template <class S>
void layernorm_forward(cudaStream_t stream, S* y, float* mean, float* rstd, const S* x,
                       const S* w, const S* b, int64_t T, int64_t C, float eps) {
  if (T <= 0) return;
  const LaunchDims l = layernorm::rows_launch(T);
  layernorm_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(y, mean, rstd, x, w, b, C, eps);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void layernorm_backward(cudaStream_t stream, S* dx, float* dw, float* db, const S* dy, const S* x,
                        const S* w, const float* mean, const float* rstd, int64_t T, int64_t C) {
  if (T <= 0) return;
  // The parameter gradients first: dx may alias dy (the model reuses gradient buffers).
  if (dw || db) {
    const LaunchDims lp = layernorm::params_launch(C);
    layernorm_params_kernel<<<lp.grid(), lp.block(), 0, stream>>>(dw, db, dy, x, mean, rstd, T,
                                                                  C);
    DHP_CUDA_CHECK_LAUNCH();
  }
  const LaunchDims ldx = layernorm::rows_launch(T);
  layernorm_dx_kernel<<<ldx.grid(), ldx.block(), 0, stream>>>(dx, dy, x, w, mean, rstd, C);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_LAYERNORM_INSTANCES(S)                                                             \
  template void layernorm_forward<S>(cudaStream_t, S*, float*, float*, const S*, const S*,    \
                                     const S*, int64_t, int64_t, float);                      \
  template void layernorm_backward<S>(cudaStream_t, S*, float*, float*, const S*, const S*,   \
                                      const S*, const float*, const float*, int64_t, int64_t);
DHP_LAYERNORM_INSTANCES(float)
DHP_LAYERNORM_INSTANCES(bf16)
#undef DHP_LAYERNORM_INSTANCES

}  // namespace dhp::cuda
