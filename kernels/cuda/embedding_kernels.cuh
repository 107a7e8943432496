// The bodies of the embedding kernels (kernels/cuda/embedding.cu launches them) and their
// launch shape. Bodies with shared memory take it as an argument (the __global__ wrapper
// declares it), so the thread emulator of the tests can run them on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::embed {

constexpr int kThreads = 256;

inline LaunchDims rows_launch(int64_t T) { return block_per_row(T, kThreads); }

struct BackwardShared {
  int64_t match[kThreads];
  int warp_count[kThreads / kWarp];
};

template <class S>
__device__ __forceinline__ void forward_block(S* out, const int32_t* ids, const S* table,
                                              int64_t C) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  S* o = out + t * C;
  const S* row = id < 0 ? nullptr : table + int64_t(id) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = row ? row[c] : st<S>(0.0f);
}

// One block per token row t. Only the block of an id's first occurrence does work: it owns
// that table row, so it can add the matching rows one after another without atomics. Matches
// are found a tile of blockDim rows at a time and compacted in row order with warp ballots.
template <class S>
__device__ __forceinline__ void backward_block(float* dtable, const S* dout, const int32_t* ids,
                                               int64_t T, int64_t C, BackwardShared& sh) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0) return;
  int earlier = 0;
  for (int64_t u = threadIdx.x; u < t; u += blockDim.x) earlier |= ids[u] == id;
  if (__syncthreads_or(earlier)) return;

  float* d = dtable + int64_t(id) * C;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int64_t base = t; base < T; base += blockDim.x) {
    const int64_t u = base + threadIdx.x;
    const bool hit = u < T && ids[u] == id;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) sh.warp_count[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < int(blockDim.x / kWarp); ++w) {
      if (w < warp) offset += sh.warp_count[w];
      total += sh.warp_count[w];
    }
    if (hit) sh.match[offset + __popc(ballot & ((1u << lane) - 1u))] = u;
    __syncthreads();
    for (int k = 0; k < total; ++k) {
      const S* src = dout + sh.match[k] * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] += ld(src[c]);
    }
    __syncthreads();
  }
}

}  // namespace dhp::cuda::embed
