// The bodies of the pointwise activation kernels (kernels/cuda/activation.cu launches them) and
// their launch shape, in a header the thread emulator of the tests can compile.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda::act {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi), as on the CPU
constexpr float kGeluA = 0.044715f;
constexpr float kSqrtHalf = 0.7071067811865476f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2·pi)
constexpr float kQuickA = 1.702f;                   // CLIP's quick_gelu

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

// The GELU family (kernels/cpu/activation.h), the same float expressions as the CPU's.
__device__ __forceinline__ float gelu(float v, GeluKind k) {
  switch (k) {
    case GeluKind::Erf: return 0.5f * v * (1.0f + erff(v * kSqrtHalf));
    case GeluKind::Quick: return v * sigmoid(kQuickA * v);
    case GeluKind::Tanh: break;
  }
  return 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
}

__device__ __forceinline__ float gelu_grad(float v, GeluKind k) {
  switch (k) {
    case GeluKind::Erf: {
      const float cdf = 0.5f * (1.0f + erff(v * kSqrtHalf));
      const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
      return cdf + v * pdf;
    }
    case GeluKind::Quick: {
      const float s = sigmoid(kQuickA * v);
      return s + kQuickA * v * s * (1.0f - s);
    }
    case GeluKind::Tanh: break;
  }
  const float th = tanhf(kGeluC * (v + kGeluA * v * v * v));
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
  return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
}

template <class S>
__device__ __forceinline__ void gelu_forward_block(S* y, const S* x, int64_t n, GeluKind k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = st<S>(gelu(ld(x[i]), k));
}

// dx may alias dy: each element is read before it is written.
template <class S>
__device__ __forceinline__ void gelu_backward_block(S* dx, const S* dy, const S* x, int64_t n,
                                                    GeluKind k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = st<S>(ld(dy[i]) * gelu_grad(ld(x[i]), k));
}

}  // namespace dhp::cuda::act
