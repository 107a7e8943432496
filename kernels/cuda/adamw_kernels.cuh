// The bodies of the AdamW kernels (kernels/cuda/adamw.cu launches them), their arguments and
// launch shapes, in a header the thread emulator of the tests can compile.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda::adamw {

constexpr int kThreads = 256;

struct Args {
  float beta1, beta2, eps, lr_wd, step, inv_bc2;
};

// Bias corrections on the host in double, rounded as the CPU reference rounds them.
inline Args args_of(const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.t));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.t));
  return Args{s.beta1, s.beta2, s.eps, s.lr * s.weight_decay, float(s.lr / bc1), float(1.0 / bc2)};
}

inline LaunchDims launch(int64_t n) { return grid_stride(n, kThreads); }

// Elements the 16-byte vector kernel updates (a multiple of 4; the scalar kernel takes the
// rest): all whole vectors when every array is aligned, none otherwise.
inline int64_t vector_part(const float* p, const float* g, const float* m, const float* v,
                           int64_t n) {
  return aligned16(p, g, m, v) && n >= 4 ? n / 4 * 4 : 0;
}

__device__ __forceinline__ void one(float& p, float g, float& m, float& v, const Args& a) {
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  const float denom = sqrtf(v * a.inv_bc2) + a.eps;
  p -= a.step * m / denom + a.lr_wd * p;
}

__device__ __forceinline__ void update_block(float* p, const float* g, float* m, float* v,
                                             int64_t n, const Args& a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    one(pi, g[i], mi, vi, a);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// Four elements per thread with 16-byte loads: the update reads and writes 4 arrays of the
// whole parameter arena, so it is bound by memory bandwidth.
__device__ __forceinline__ void update4_block(float4* p, const float4* g, float4* m, float4* v,
                                              int64_t n4, const Args& a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    one(pi.x, gi.x, mi.x, vi.x, a);
    one(pi.y, gi.y, mi.y, vi.y, a);
    one(pi.z, gi.z, mi.z, vi.z, a);
    one(pi.w, gi.w, mi.w, vi.w, a);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace dhp::cuda::adamw
