// The bodies of the RMSNorm kernels (kernels/cuda/norm.cu launches them) and their launch
// shapes. Each body takes its shared memory as an argument (the __global__ wrapper declares
// it), so the thread emulator of the tests can run it on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/norm.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/scratch.h"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::norm {

constexpr int kThreads = 256;
// Rows up to this wide (Qwen3's per-head q/k norms, head_dim 64..256) take one warp each,
// kRowsPerBlock rows to a block: a block of 256 threads on a 128-wide row would leave half
// of them idle and launch a block per (token, head).
constexpr int64_t kWarpRowMax = 512;
constexpr int kRowsPerBlock = kThreads / kWarp;
// dw: 32 columns per block, 16 row lanes combined in lane order. Many rows are cut into
// slices (grid.y) whose sums go to a partial buffer, then are added over the slices in order:
// without slices a 128-column dw over 100k rows would run on 4 blocks.
constexpr int kColTile = 32, kRowLanes = 16;
constexpr int64_t kDwRowsPerSlice = 512;
constexpr int kDwMaxSlices = 256;

// Shared memory of the row bodies (one block_sum's kWarp floats) and of dw_block.
constexpr int kRowSharedFloats = kWarp;
using DwShared = float[kRowLanes][kColTile];

inline LaunchDims rows_launch(int64_t T, int64_t C) {
  if (C <= kWarpRowMax) return LaunchDims{blocks_for(T, kRowsPerBlock), 1, kWarp, kRowsPerBlock};
  return block_per_row(T, kThreads);
}
// Row slices of dw for T rows of C columns, with kNormDwPartialFloats (scratch.h) of room.
inline int dw_slices(int64_t T, int64_t C) {
  int64_t s = (T + kDwRowsPerSlice - 1) / kDwRowsPerSlice;
  if (s > kDwMaxSlices) s = kDwMaxSlices;
  if (s * C > kNormDwPartialFloats) s = kNormDwPartialFloats / C;
  return s < 1 ? 1 : int(s);
}
inline LaunchDims dw_launch(int64_t T, int64_t C) {
  return LaunchDims{unsigned((C + kColTile - 1) / kColTile), unsigned(dw_slices(T, C)), kColTile, kRowLanes};
}
inline LaunchDims dw_finish_launch(int64_t C) { return grid_stride(C, kThreads); }

// The rows a thread's warp (or block) normalises: one warp per row in blocks of
// kRowsPerBlock warps (blockDim.y > 1), else one block per row.
struct RowWalk {
  int64_t first, step;
  int lane, width;
};
__device__ __forceinline__ RowWalk row_walk() {
  if (blockDim.y > 1)
    return {int64_t(blockIdx.x) * blockDim.y + threadIdx.y, int64_t(gridDim.x) * blockDim.y, int(threadIdx.x),
            kWarp};
  return {int64_t(blockIdx.x), int64_t(gridDim.x), int(threadIdx.x), int(blockDim.x)};
}
// Sum over the threads that share a row: its warp, or its block.
__device__ __forceinline__ float row_sum(float v, float* shared) {
  return blockDim.y > 1 ? warp_sum(v) : block_sum(v, shared);
}

// T: the storage of x, y and w. Every thread of a row's warp or block runs the same
// iterations, so the reductions inside the loop see all of them.
template <class T>
__device__ __forceinline__ void forward_block(T* y, float* rstd, const T* x, const T* w, int64_t rows,
                                              int64_t C, float eps, float* shared) {
  const RowWalk rw = row_walk();
  for (int64_t t = rw.first; t < rows; t += rw.step) {
    const T* xt = x + t * C;
    float ss = 0.0f;
    for (int64_t c = rw.lane; c < C; c += rw.width) ss += ld(xt[c]) * ld(xt[c]);
    ss = row_sum(ss, shared);
    const float r = 1.0f / sqrtf(ss / float(C) + eps);
    if (rw.lane == 0) rstd[t] = r;
    T* yt = y + t * C;
    for (int64_t c = rw.lane; c < C; c += rw.width) yt[c] = st<T>(ld(xt[c]) * r * ld(w[c]));
  }
}

// dx = rstd · (g - n · mean(g·n)) with g = w·dy, n = x·rstd.
template <class T>
__device__ __forceinline__ void dx_block(T* dx, const T* dy, const T* x, const T* w, const float* rstd,
                                         int64_t rows, int64_t C, float* shared) {
  const RowWalk rw = row_walk();
  for (int64_t t = rw.first; t < rows; t += rw.step) {
    const T* xt = x + t * C;
    const T* dyt = dy + t * C;
    const float r = rstd[t];
    float dot = 0.0f;
    for (int64_t c = rw.lane; c < C; c += rw.width) dot += ld(w[c]) * ld(dyt[c]) * ld(xt[c]) * r;
    const float mean = row_sum(dot, shared) / float(C);
    T* dxt = dx + t * C;
    // Every thread has read its dy and x above (the reduction synchronises the row's threads)
    // before dx, which may alias dy, is written; each thread rereads only its own columns.
    for (int64_t c = rw.lane; c < C; c += rw.width)
      dxt[c] = st<T>(r * (ld(w[c]) * ld(dyt[c]) - ld(xt[c]) * r * mean));
  }
}

// sum_t dy·x·rstd over the rows of slice blockIdx.y: added to dw[c] when there is one slice,
// else written to partial[slice · C + c] for dw_finish.
template <class S>
__device__ __forceinline__ void dw_block(float* dw, float* partial, const S* dy, const S* x, const float* rstd,
                                         int64_t T, int64_t C, DwShared& part) {
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  const int64_t per = (T + gridDim.y - 1) / gridDim.y;
  const int64_t t0 = int64_t(blockIdx.y) * per, t1 = t0 + per < T ? t0 + per : T;
  float s = 0.0f;
  if (c < C)
    for (int64_t t = t0 + threadIdx.y; t < t1; t += kRowLanes) s += ld(dy[t * C + c]) * ld(x[t * C + c]) * rstd[t];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int r = 0; r < kRowLanes; ++r) total += part[r][threadIdx.x];
    if (gridDim.y == 1) dw[c] += total;
    else partial[blockIdx.y * C + c] = total;
  }
}

// dw[c] += the slices' sums, in slice order.
__device__ __forceinline__ void dw_finish(float* dw, const float* partial, int slices, int64_t C) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    float total = 0.0f;
    for (int s = 0; s < slices; ++s) total += partial[s * C + c];
    dw[c] += total;
  }
}

}  // namespace dhp::cuda::norm
