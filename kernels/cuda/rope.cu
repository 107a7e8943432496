#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rope_kernels.cuh"

namespace dhp::cuda {
namespace {

// The spec by value: a kernel argument (a few doubles).
template <class S>
__global__ void rope_kernel(S* x, const int32_t* pos, int64_t T, int H, int hd, int offset,
                            int span, RopeSpec rope, float sign) {
  rope::rotate_block(x, pos, T, H, hd, offset, span, rope, sign);
}

}  // namespace

template <class S>
void rope_rotate(cudaStream_t stream, S* x, const int32_t* pos, int64_t T, int H, int hd,
                 int offset, int span, const RopeSpec& rope, float sign) {
  const int64_t n = T * (span / 2);
  if (n <= 0) return;
  const LaunchDims l = rope::launch(n);
  rope_kernel<<<l.grid(), l.block(), 0, stream>>>(x, pos, T, H, hd, offset, span, rope, sign);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void rope_forward(cudaStream_t stream, S* x, const int32_t* pos, int64_t T, int H, int hd,
                  const RopeSpec& rope) {
  rope_rotate(stream, x, pos, T, H, hd, 0, hd, rope, 1.0f);
}

template <class S>
void rope_backward(cudaStream_t stream, S* dx, const int32_t* pos, int64_t T, int H, int hd,
                   const RopeSpec& rope) {
  rope_rotate(stream, dx, pos, T, H, hd, 0, hd, rope, -1.0f);
}

template <class S>
void rope2d_forward(cudaStream_t stream, S* x, const int32_t* row, const int32_t* col,
                    int64_t T, int H, int hd, const RopeSpec& rope) {
  rope_rotate(stream, x, row, T, H, hd, 0, hd / 2, rope, 1.0f);
  rope_rotate(stream, x, col, T, H, hd, hd / 2, hd / 2, rope, 1.0f);
}

template <class S>
void rope2d_backward(cudaStream_t stream, S* dx, const int32_t* row, const int32_t* col,
                     int64_t T, int H, int hd, const RopeSpec& rope) {
  rope_rotate(stream, dx, row, T, H, hd, 0, hd / 2, rope, -1.0f);
  rope_rotate(stream, dx, col, T, H, hd, hd / 2, hd / 2, rope, -1.0f);
}

#define DHP_ROPE_INSTANCES(S)                                                                \
  template void rope_forward<S>(cudaStream_t, S*, const int32_t*, int64_t, int, int,         \
                                const RopeSpec&);                                            \
  template void rope_backward<S>(cudaStream_t, S*, const int32_t*, int64_t, int, int,        \
                                 const RopeSpec&);                                           \
  template void rope2d_forward<S>(cudaStream_t, S*, const int32_t*, const int32_t*, int64_t, \
                                  int, int, const RopeSpec&);                                \
  template void rope2d_backward<S>(cudaStream_t, S*, const int32_t*, const int32_t*,         \
                                   int64_t, int, int, const RopeSpec&);
DHP_ROPE_INSTANCES(float)
DHP_ROPE_INSTANCES(bf16)
#undef DHP_ROPE_INSTANCES

}  // namespace dhp::cuda
