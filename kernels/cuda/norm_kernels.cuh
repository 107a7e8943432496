// The bodies of the RMSNorm kernels (kernels/cuda/norm.cu launches them) and their launch
// shapes. Each body takes its shared memory as an argument (the __global__ wrapper declares
// it), so the thread emulator of the tests can run it on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/norm.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::norm {

constexpr int kThreads = 256;
// dw: 32 columns per block, 16 row lanes combined in lane order.
constexpr int kColTile = 32, kRowLanes = 16;

// Shared memory of the row bodies (one block_sum's kWarp floats) and of dw_block.
constexpr int kRowSharedFloats = kWarp;
using DwShared = float[kRowLanes][kColTile];

inline LaunchDims rows_launch(int64_t T) { return block_per_row(T, kThreads); }
inline LaunchDims dw_launch(int64_t C) {
  return LaunchDims{unsigned((C + kColTile - 1) / kColTile), 1, kColTile, kRowLanes};
}

// One block per row. T: the storage of x, y and w.
template <class T>
__device__ __forceinline__ void forward_block(T* y, float* rstd, const T* x, const T* w, int64_t C,
                                              float eps, float* shared) {
  const int64_t t = blockIdx.x;
  const T* xt = x + t * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += ld(xt[c]) * ld(xt[c]);
  ss = block_sum(ss, shared);
  const float r = 1.0f / sqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  T* yt = y + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yt[c] = st<T>(ld(xt[c]) * r * ld(w[c]));
}

// dx = rstd · (g - n · mean(g·n)) with g = w·dy, n = x·rstd. One block per row.
template <class T>
__device__ __forceinline__ void dx_block(T* dx, const T* dy, const T* x, const T* w,
                                         const float* rstd, int64_t C, float* shared) {
  const int64_t t = blockIdx.x;
  const T* xt = x + t * C;
  const T* dyt = dy + t * C;
  const float r = rstd[t];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dot += ld(w[c]) * ld(dyt[c]) * ld(xt[c]) * r;
  const float mean = block_sum(dot, shared) / float(C);
  T* dxt = dx + t * C;
  // Every thread has read its dy and x above (block_sum synchronises) before dx, which may
  // alias dy, is written; each thread rereads only its own columns.
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dxt[c] = st<T>(r * (ld(w[c]) * ld(dyt[c]) - ld(xt[c]) * r * mean));
}

// dw[c] += sum_t dy·x·rstd.
template <class S>
__device__ __forceinline__ void dw_block(float* dw, const S* dy, const S* x, const float* rstd,
                                         int64_t T, int64_t C, DwShared& part) {
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (int64_t t = threadIdx.y; t < T; t += kRowLanes)
      s += ld(dy[t * C + c]) * ld(x[t * C + c]) * rstd[t];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int r = 0; r < kRowLanes; ++r) total += part[r][threadIdx.x];
    dw[c] += total;
  }
}

}  // namespace dhp::cuda::norm
