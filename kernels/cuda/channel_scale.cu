#include "kernels/cuda/channel_scale_kernels.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void channel_scale_kernel(S* y, const S* x, const S* w, int64_t n, int64_t C) {
  channel_scale::scale_block(y, x, w, n, C);
}

template <class S>
__global__ void channel_scale_params_kernel(float* dw, const S* dy, const S* x, int64_t T, int64_t C) {
  __shared__ channel_scale::ParamShared part;
  channel_scale::params_block(dw, dy, x, T, C, part);
}

}  // namespace

template <class S>
void channel_scale_forward(cudaStream_t stream, S* y, const S* x, const S* w, int64_t T, int64_t C) {
  if (T <= 0) return;
  const LaunchDims l = channel_scale::elements_launch(T * C);
  channel_scale_kernel<<<l.grid(), l.block(), 0, stream>>>(y, x, w, T * C, C);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void channel_scale_backward(cudaStream_t stream, S* dx, float* dw, const S* dy, const S* x, const S* w,
                            int64_t T, int64_t C) {
  if (T <= 0) return;
  // The weight's gradient first: dx may alias dy.
  if (dw) {
    const LaunchDims lp = channel_scale::params_launch(C);
    channel_scale_params_kernel<<<lp.grid(), lp.block(), 0, stream>>>(dw, dy, x, T, C);
    DHP_CUDA_CHECK_LAUNCH();
  }
  const LaunchDims l = channel_scale::elements_launch(T * C);
  channel_scale_kernel<<<l.grid(), l.block(), 0, stream>>>(dx, dy, w, T * C, C);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_CHANNEL_SCALE_INSTANCES(S)                                                          \
  template void channel_scale_forward<S>(cudaStream_t, S*, const S*, const S*, int64_t, int64_t); \
  template void channel_scale_backward<S>(cudaStream_t, S*, float*, const S*, const S*, const S*,  \
                                          int64_t, int64_t);
DHP_CHANNEL_SCALE_INSTANCES(float)
DHP_CHANNEL_SCALE_INSTANCES(bf16)
#undef DHP_CHANNEL_SCALE_INSTANCES

}  // namespace dhp::cuda
