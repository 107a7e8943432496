#include "kernels/cuda/check.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rope.h"

namespace dhp::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (token, pair); the angle is computed once and applied to every head.
// Angles in double as on the CPU: positions reach 1e5 and float loses the phase there.
__global__ void rope_kernel(float* x, const int32_t* pos, int64_t T, int H, int hd, int offset,
                            int span, double theta, float sign) {
  const int half = span / 2;
  const int64_t n = T * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = k / half;
    const int i = int(k % half);
    const double a = double(pos[t]) * pow(theta, -2.0 * i / span);
    const float c = float(cos(a)), s = sign * float(sin(a));
    for (int h = 0; h < H; ++h) {
      float* v = x + (t * H + h) * hd + offset;
      const float x0 = v[i], x1 = v[i + half];
      v[i] = x0 * c - x1 * s;
      v[i + half] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

void rope_rotate(cudaStream_t stream, float* x, const int32_t* pos, int64_t T, int H, int hd,
                 int offset, int span, double theta, float sign) {
  const int64_t n = T * (span / 2);
  if (n <= 0) return;
  rope_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, pos, T, H, hd, offset, span,
                                                                 theta, sign);
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
