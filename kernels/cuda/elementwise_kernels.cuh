// The bodies of the small vector kernels (kernels/cuda/elementwise.cu launches them) and their
// launch shapes. Bodies with shared memory take it as an argument (the __global__ wrapper
// declares it), so the thread emulator of the tests can run them on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/scratch.h"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::ew {

constexpr int kThreads = 256;
// The second stage of sum_squares: one block adds the partials.
constexpr int kPartialThreads = 1024;
// Column sums: 32 columns per block, 16 row lanes, so warps read 128 contiguous bytes; lane
// sums are combined in lane order.
constexpr int kColTile = 32, kRowLanes = 16;
using ColumnShared = float[kRowLanes][kColTile];

inline LaunchDims launch(int64_t n) { return grid_stride(n, kThreads); }
inline LaunchDims rows_launch(int64_t T) { return block_per_row(T, kThreads); }
// The grid is fixed (not sized by the device or n), so the summation order is too.
inline LaunchDims sum_squares_launch() { return LaunchDims{kSumSquaresBlocks, 1, kThreads, 1}; }
inline LaunchDims partials_launch() { return LaunchDims{1, 1, kPartialThreads, 1}; }
inline LaunchDims columns_launch(int64_t C) {
  return LaunchDims{unsigned((C + kColTile - 1) / kColTile), 1, kColTile, kRowLanes};
}
// add_inplace takes 16-byte vectors when both arrays allow them.
inline bool add_vec4(const float* y, const float* x, int64_t n) {
  return aligned16(y, x) && n % 4 == 0;
}

template <class S>
__device__ __forceinline__ void add_block(S* y, const S* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = st<S>(ld(y[i]) + ld(x[i]));
}

template <class S>
__device__ __forceinline__ void accumulate_block(float* acc, const S* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    acc[i] += ld(x[i]);
}

__device__ __forceinline__ void add4_block(float4* y, const float4* x, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 a = y[i], b = x[i];
    y[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
}

__device__ __forceinline__ void scale_block(float* y, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] *= s;
}

template <class S>
__device__ __forceinline__ void fill_block(S* y, float value, int64_t n) {
  const S v = st<S>(value);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = v;
}

// y = x rounded to the storage S.
template <class S>
__device__ __forceinline__ void cast_block(S* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = st<S>(x[i]);
}

// shared: kWarp doubles.
__device__ __forceinline__ void sum_squares_partial_block(double* partial, const float* x,
                                                          int64_t n, double* shared) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    s += double(x[i]) * x[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// shared: kWarp doubles.
__device__ __forceinline__ void sum_partials_block(double* out, const double* partial, int n,
                                                   double* shared) {
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *out = s;
}

template <class S>
__device__ __forceinline__ void row_bias_block(S* y, const S* b, int64_t T, int64_t C) {
  const int64_t n = T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = st<S>(ld(y[i]) + ld(b[i % C]));
}

// One block per row; rows without a slot are skipped. dst row = src row.
template <class S>
__device__ __forceinline__ void copy_rows_block(S* dst, const S* src, const int32_t* slot,
                                                int64_t C, bool scatter) {
  const int64_t t = blockIdx.x;
  const int32_t s = slot[t];
  if (s < 0) return;
  S* d = dst + (scatter ? t : int64_t(s)) * C;
  const S* x = src + (scatter ? int64_t(s) : t) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] = x[c];
}

template <class S>
__device__ __forceinline__ void column_sum_block(float* db, const S* x, int64_t T, int64_t C,
                                                 ColumnShared& part) {
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (int64_t t = threadIdx.y; t < T; t += kRowLanes) s += ld(x[t * C + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int r = 0; r < kRowLanes; ++r) total += part[r][threadIdx.x];
    db[c] += total;
  }
}

}  // namespace dhp::cuda::ew
