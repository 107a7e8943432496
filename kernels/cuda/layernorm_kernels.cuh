// The bodies of the LayerNorm kernels (kernels/cuda/layernorm.cu launches them) and their
// launch shapes; the CPU reference is kernels/cpu/layernorm.h. Each body takes its shared
// memory as an argument (the __global__ wrapper declares it), so the thread emulator of the
// tests can run it on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::layernorm {

constexpr int kThreads = 256;
// dw and db: 32 columns per block, 16 row lanes combined in lane order.
constexpr int kColTile = 32, kRowLanes = 16;

// Shared memory of the row bodies (one block_sum's kWarp floats) and of params_block.
constexpr int kRowSharedFloats = kWarp;
struct ParamShared {
  float w[kRowLanes][kColTile];
  float b[kRowLanes][kColTile];
};

inline LaunchDims rows_launch(int64_t T) { return block_per_row(T, kThreads); }
inline LaunchDims params_launch(int64_t C) {
  return LaunchDims{unsigned((C + kColTile - 1) / kColTile), 1, kColTile, kRowLanes};
}

// One block per row. Two passes over the row (mean, then the squares of the deviations), as on
// the CPU: the variance keeps its digits when the mean is far from zero.
template <class T>
__device__ __forceinline__ void forward_block(T* y, float* mean, float* rstd, const T* x,
                                              const T* w, const T* b, int64_t C, float eps,
                                              float* shared) {
  const int64_t t = blockIdx.x;
  const T* xt = x + t * C;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += ld(xt[c]);
  const float m = block_sum(s, shared) / float(C);
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = ld(xt[c]) - m;
    ss += d * d;
  }
  const float r = 1.0f / sqrtf(block_sum(ss, shared) / float(C) + eps);
  if (threadIdx.x == 0) {
    mean[t] = m;
    rstd[t] = r;
  }
  T* yt = y + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    yt[c] = st<T>((ld(xt[c]) - m) * r * ld(w[c]) + ld(b[c]));
}

// dx = rstd · (g - mean(g) - n · mean(g·n)) with g = w·dy, n = (x - mean)·rstd. One block per
// row.
template <class T>
__device__ __forceinline__ void dx_block(T* dx, const T* dy, const T* x, const T* w,
                                         const float* mean, const float* rstd, int64_t C,
                                         float* shared) {
  const int64_t t = blockIdx.x;
  const T* xt = x + t * C;
  const T* dyt = dy + t * C;
  const float m = mean[t], r = rstd[t];
  float sg = 0.0f, sgn = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = ld(w[c]) * ld(dyt[c]);
    sg += g;
    sgn += g * ((ld(xt[c]) - m) * r);
  }
  const float mg = block_sum(sg, shared) / float(C);
  const float mgn = block_sum(sgn, shared) / float(C);
  T* dxt = dx + t * C;
  // Every thread has read its dy and x above (block_sum synchronises) before dx, which may
  // alias dy, is written; each thread rereads only its own columns.
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dxt[c] = st<T>(r * (ld(w[c]) * ld(dyt[c]) - mg - (ld(xt[c]) - m) * r * mgn));
}

// dw[c] += sum_t dy·(x - mean)·rstd and db[c] += sum_t dy, each null when frozen: 16 row lanes
// of every 16th row, then the lanes in order. Deterministic, free of atomics.
template <class S>
__device__ __forceinline__ void params_block(float* dw, float* db, const S* dy, const S* x,
                                             const float* mean, const float* rstd, int64_t T,
                                             int64_t C, ParamShared& part) {
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  float sw = 0.0f, sb = 0.0f;
  if (c < C)
    for (int64_t t = threadIdx.y; t < T; t += kRowLanes) {
      const float g = ld(dy[t * C + c]);
      sw += g * ((ld(x[t * C + c]) - mean[t]) * rstd[t]);
      sb += g;
    }
  part.w[threadIdx.y][threadIdx.x] = sw;
  part.b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int r = 0; r < kRowLanes; ++r) {
      tw += part.w[r][threadIdx.x];
      tb += part.b[r][threadIdx.x];
    }
    if (dw) dw[c] += tw;
    if (db) db[c] += tb;
  }
}

}  // namespace dhp::cuda::layernorm
