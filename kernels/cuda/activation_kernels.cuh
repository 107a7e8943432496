// The bodies of the pointwise activation kernels (kernels/cuda/activation.cu launches them) and
// their launch shape, in a header the thread emulator of the tests can compile.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"

namespace dhp::cuda::act {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi), as on the CPU
constexpr float kGeluA = 0.044715f;

inline LaunchDims launch(int64_t n) { return grid_stride(n, kThreads); }

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ void swiglu_forward_block(float* h, const float* a, const float* b,
                                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    h[i] = a[i] * sigmoid(a[i]) * b[i];
}

__device__ __forceinline__ void swiglu_backward_block(float* da, float* db, const float* dh,
                                                      const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float s = sigmoid(a[i]);
    const float silu = a[i] * s;
    // Read everything before writing: da may alias dh.
    const float g = dh[i], bi = b[i];
    db[i] = g * silu;
    da[i] = g * bi * (s + silu * (1.0f - s));
  }
}

__device__ __forceinline__ void gelu_forward_block(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
  }
}

__device__ __forceinline__ void gelu_backward_block(float* dx, const float* dy, const float* x,
                                                    int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float th = tanhf(kGeluC * (v + kGeluA * v * v * v));
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
  }
}

}  // namespace dhp::cuda::act
