#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/embedding_kernels.cuh"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void embedding_forward_kernel(S* out, const int32_t* ids, const S* table, int64_t C) {
  embed::forward_block(out, ids, table, C);
}

template <class S>
__global__ void embedding_backward_kernel(float* dtable, const S* dout, const int32_t* ids,
                                          int64_t T, int64_t C) {
  __shared__ embed::BackwardShared sh;
  embed::backward_block(dtable, dout, ids, T, C, sh);
}

}  // namespace

template <class S>
void embedding_forward(cudaStream_t stream, S* out, const int32_t* ids, const S* table, int64_t T,
                       int64_t C) {
  if (T <= 0) return;
  const LaunchDims l = embed::rows_launch(T);
  embedding_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(out, ids, table, C);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void embedding_backward(cudaStream_t stream, float* dtable, const S* dout, const int32_t* ids,
                        int64_t T, int64_t C) {
  if (T <= 0) return;
  const LaunchDims l = embed::rows_launch(T);
  embedding_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(dtable, dout, ids, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_EMBEDDING_INSTANCES(S)                                                             \
  template void embedding_forward<S>(cudaStream_t, S*, const int32_t*, const S*, int64_t,       \
                                     int64_t);                                                  \
  template void embedding_backward<S>(cudaStream_t, float*, const S*, const int32_t*, int64_t,  \
                                      int64_t);
DHP_EMBEDDING_INSTANCES(float)
DHP_EMBEDDING_INSTANCES(bf16)
#undef DHP_EMBEDDING_INSTANCES

}  // namespace dhp::cuda
