#include "kernels/cuda/check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/embedding_kernels.cuh"

namespace dhp::cuda {
namespace {

__global__ void embedding_forward_kernel(float* out, const int32_t* ids, const float* table,
                                         int64_t C) {
  embed::forward_block(out, ids, table, C);
}

__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int32_t* ids,
                                          int64_t T, int64_t C) {
  __shared__ embed::BackwardShared sh;
  embed::backward_block(dtable, dout, ids, T, C, sh);
}

}  // namespace

void embedding_forward(cudaStream_t stream, float* out, const int32_t* ids, const float* table,
                       int64_t T, int64_t C) {
  if (T <= 0) return;
  const LaunchDims l = embed::rows_launch(T);
  embedding_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(out, ids, table, C);
  DHP_CUDA_CHECK_LAUNCH();
}

void embedding_backward(cudaStream_t stream, float* dtable, const float* dout, const int32_t* ids,
                        int64_t T, int64_t C) {
  if (T <= 0) return;
  const LaunchDims l = embed::rows_launch(T);
  embedding_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(dtable, dout, ids, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
