#include "kernels/cuda/check.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_kernels.cuh"

namespace dhp::cuda {
namespace {

__global__ void rope_kernel(float* x, const int32_t* pos, int64_t T, int H, int hd, int offset,
                            int span, double theta, float sign) {
  rope::rotate_block(x, pos, T, H, hd, offset, span, theta, sign);
}

}  // namespace

void rope_rotate(cudaStream_t stream, float* x, const int32_t* pos, int64_t T, int H, int hd,
                 int offset, int span, double theta, float sign) {
  const int64_t n = T * (span / 2);
  if (n <= 0) return;
  const LaunchDims l = rope::launch(n);
  rope_kernel<<<l.grid(), l.block(), 0, stream>>>(x, pos, T, H, hd, offset, span, theta, sign);
  DHP_CUDA_CHECK_LAUNCH();
}

void rope_forward(cudaStream_t stream, float* x, const int32_t* pos, int64_t T, int H, int hd,
                  double theta) {
  rope_rotate(stream, x, pos, T, H, hd, 0, hd, theta, 1.0f);
}

void rope_backward(cudaStream_t stream, float* dx, const int32_t* pos, int64_t T, int H, int hd,
                   double theta) {
  rope_rotate(stream, dx, pos, T, H, hd, 0, hd, theta, -1.0f);
}

void rope2d_forward(cudaStream_t stream, float* x, const int32_t* row, const int32_t* col,
                    int64_t T, int H, int hd, double theta) {
  rope_rotate(stream, x, row, T, H, hd, 0, hd / 2, theta, 1.0f);
  rope_rotate(stream, x, col, T, H, hd, hd / 2, hd / 2, theta, 1.0f);
}

void rope2d_backward(cudaStream_t stream, float* dx, const int32_t* row, const int32_t* col,
                     int64_t T, int H, int hd, double theta) {
  rope_rotate(stream, dx, row, T, H, hd, 0, hd / 2, theta, -1.0f);
  rope_rotate(stream, dx, col, T, H, hd, hd / 2, hd / 2, theta, -1.0f);
}

}  // namespace dhp::cuda
