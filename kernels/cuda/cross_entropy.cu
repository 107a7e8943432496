#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/cross_entropy_kernels.cuh"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void cross_entropy_forward_kernel(float* lse, CrossEntropyRow* rows, const S* logits,
                                             const int32_t* targets, int64_t V) {
  __shared__ xent::Online shared[kWarp];
  xent::forward_block(lse, rows, logits, targets, V, shared);
}

__global__ void cross_entropy_stats_kernel(CrossEntropyStats* stats, const CrossEntropyRow* rows,
                                           int64_t n) {
  __shared__ double shared[kWarp];
  xent::stats_block(stats, rows, n, shared);
}

template <class S>
__global__ void cross_entropy_backward_kernel(S* dlogits, const S* logits, const float* lse,
                                              const int32_t* targets, int64_t V, float scale,
                                              bool vec4) {
  xent::backward_block(dlogits, logits, lse, targets, V, scale, vec4);
}

}  // namespace

template <class S>
void cross_entropy_forward(cudaStream_t stream, float* lse, CrossEntropyStats* stats,
                           CrossEntropyRow* rows, const S* logits, const int32_t* targets,
                           int64_t T, int64_t V) {
  for (int64_t t0 = 0; t0 < T; t0 += kCrossEntropyRows) {
    const int64_t n = T - t0 < kCrossEntropyRows ? T - t0 : kCrossEntropyRows;
    const LaunchDims lr = xent::rows_launch(n);
    cross_entropy_forward_kernel<<<lr.grid(), lr.block(), 0, stream>>>(
        lse + t0, rows, logits + t0 * V, targets + t0, V);
    DHP_CUDA_CHECK_LAUNCH();
    const LaunchDims ls = xent::stats_launch();
    cross_entropy_stats_kernel<<<ls.grid(), ls.block(), 0, stream>>>(stats, rows, n);
    DHP_CUDA_CHECK_LAUNCH();
  }
}

template <class S>
void cross_entropy_backward(cudaStream_t stream, S* dlogits, const S* logits, const float* lse,
                            const int32_t* targets, int64_t T, int64_t V, float scale) {
  if (T <= 0) return;
  const LaunchDims l = xent::rows_launch(T);
  cross_entropy_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(
      dlogits, logits, lse, targets, V, scale, xent::backward_vec4(dlogits, logits, V));
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_XENT_INSTANCES(S)                                                                 \
  template void cross_entropy_forward<S>(cudaStream_t, float*, CrossEntropyStats*,            \
                                         CrossEntropyRow*, const S*, const int32_t*, int64_t, \
                                         int64_t);                                            \
  template void cross_entropy_backward<S>(cudaStream_t, S*, const S*, const float*,           \
                                          const int32_t*, int64_t, int64_t, float);
DHP_XENT_INSTANCES(float)
DHP_XENT_INSTANCES(bf16)
#undef DHP_XENT_INSTANCES

}  // namespace dhp::cuda
