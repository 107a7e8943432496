// The bodies of the pointwise activation kernels (kernels/cuda/activation.cu launches them) and
// their launch shape, in a header the thread emulator of the tests can compile.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::act {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi), as on the CPU
constexpr float kGeluA = 0.044715f;

inline LaunchDims launch(int64_t n) { return grid_stride(n, kThreads); }

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <class S>
__device__ __forceinline__ void swiglu_forward_block(S* h, const S* a, const S* b,
                                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    h[i] = st<S>(ld(a[i]) * sigmoid(ld(a[i])) * ld(b[i]));
}

template <class S>
__device__ __forceinline__ void swiglu_backward_block(S* da, S* db, const S* dh,
                                                      const S* a, const S* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float ai = ld(a[i]), s = sigmoid(ai);
    const float silu = ai * s;
    // Read everything before writing: da may alias dh.
    const float g = ld(dh[i]), bi = ld(b[i]);
    db[i] = st<S>(g * silu);
    da[i] = st<S>(g * bi * (s + silu * (1.0f - s)));
  }
}

template <class S>
__device__ __forceinline__ void gelu_forward_block(S* y, const S* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = ld(x[i]);
    y[i] = st<S>(0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v))));
  }
}

template <class S>
__device__ __forceinline__ void gelu_backward_block(S* dx, const S* dy, const S* x,
                                                    int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = ld(x[i]);
    const float th = tanhf(kGeluC * (v + kGeluA * v * v * v));
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = st<S>(ld(dy[i]) * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du));
  }
}

}  // namespace dhp::cuda::act
