// Warp and block reductions shared by the kernels of this folder. The order of every sum is a
// function of the block size only, so results are the same bits on every run.
#pragma once

#include <cuda_runtime.h>

namespace dhp::cuda {

constexpr int kWarp = 32;

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__device__ inline T warp_max(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 and at
// most 1024; `shared` holds 32 values. Callable repeatedly (it synchronises before reuse).
template <class T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

// Blocks for n items at `per_block` items each, capped so grid-stride loops cover the rest.
inline unsigned blocks_for(long long n, int per_block, long long cap = 65535LL * 16) {
  long long b = (n + per_block - 1) / per_block;
  if (b < 1) b = 1;
  return unsigned(b < cap ? b : cap);
}

// Whether every pointer is 16-byte aligned, so float4 loads and stores are legal.
inline bool aligned16(const void* a, const void* b = nullptr, const void* c = nullptr,
                      const void* d = nullptr) {
  auto ok = [](const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15u) == 0; };
  return ok(a) && ok(b) && ok(c) && ok(d);
}

}  // namespace dhp::cuda
