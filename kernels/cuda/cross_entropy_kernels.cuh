// The bodies of the cross-entropy kernels (kernels/cuda/cross_entropy.cu launches them) and
// their launch shapes. Bodies with shared memory take it as an argument (the __global__
// wrapper declares it), so the thread emulator of the tests can run them on the CPU.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/scratch.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda::xent {

constexpr int kThreads = 512;
// The statistics: one block adds every row's.
constexpr int kStatsThreads = 1024;

inline LaunchDims rows_launch(int64_t T) { return block_per_row(T, kThreads); }
inline LaunchDims stats_launch() { return LaunchDims{1, 1, kStatsThreads, 1}; }
// The backward pass takes 16-byte vectors when every row starts 16-byte aligned: the base
// pointers are and V is a multiple of 4.
template <class S>
inline bool backward_vec4(const S* dlogits, const S* logits, int64_t V) {
  return std::is_same_v<S, float> && aligned16(dlogits, logits) && V % 4 == 0;
}

// Running (max, sum of exp(x - max), first index of the max) of a part of a row.
struct Online {
  float mx;
  float sum;
  int64_t arg;
};

__device__ __forceinline__ Online combine(Online a, Online b) {
  if (b.mx > a.mx || (b.mx == a.mx && b.arg < a.arg)) {
    const Online t = a;
    a = b;
    b = t;
  }
  // a holds the larger max (ties: the earlier index, as the CPU's first-max scan).
  const float sb = b.mx == -FLT_MAX ? 0.0f : b.sum * expf(b.mx - a.mx);
  return Online{a.mx, a.sum + sb, a.arg};
}

__device__ __forceinline__ Online shfl(Online o, int lane_mask) {
  return Online{__shfl_xor_sync(0xffffffffu, o.mx, lane_mask),
                __shfl_xor_sync(0xffffffffu, o.sum, lane_mask),
                __shfl_xor_sync(0xffffffffu, o.arg, lane_mask)};
}

// One block per row. shared: kWarp Online values.
template <class S>
__device__ __forceinline__ void forward_block(float* lse, CrossEntropyRow* rows, const S* logits,
                                              const int32_t* targets, int64_t V, Online* shared) {
  const int64_t t = blockIdx.x;
  const S* row = logits + t * V;
  Online o{-FLT_MAX, 0.0f, V};
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = ld(row[v]);
    if (x > o.mx) {
      o.sum = o.sum * expf(o.mx - x) + 1.0f;
      o.mx = x;
      o.arg = v;
    } else {
      o.sum += expf(x - o.mx);
    }
  }
  for (int m = kWarp / 2; m > 0; m /= 2) o = combine(o, shfl(o, m));
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) shared[warp] = o;
  __syncthreads();
  if (warp != 0) return;
  o = lane < int(blockDim.x / kWarp) ? shared[lane] : Online{-FLT_MAX, 0.0f, V};
  for (int m = kWarp / 2; m > 0; m /= 2) o = combine(o, shfl(o, m));
  if (lane != 0) return;
  const float l = o.mx + logf(o.sum);
  lse[t] = l;
  const int32_t target = targets[t];
  CrossEntropyRow r{0.0, 0, 0};
  if (target >= 0) r = CrossEntropyRow{double(l) - ld(row[target]), o.arg == target, 1};
  rows[t] = r;
}

// One block adds the rows' statistics in a fixed order, then to *stats. shared: kWarp doubles.
__device__ __forceinline__ void stats_block(CrossEntropyStats* stats, const CrossEntropyRow* rows,
                                            int64_t n, double* shared) {
  double loss = 0.0, count = 0.0, correct = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    loss += rows[i].loss;
    count += rows[i].counted;
    correct += rows[i].hit;
  }
  loss = block_sum(loss, shared);
  count = block_sum(count, shared);
  correct = block_sum(correct, shared);
  if (threadIdx.x == 0) {
    stats->loss_sum += loss;
    stats->count += count;
    stats->correct += correct;
  }
}

// One block per row.
template <class S>
__device__ __forceinline__ void backward_block(S* dlogits, const S* logits, const float* lse,
                                               const int32_t* targets, int64_t V, float scale,
                                               bool vec4) {
  const int64_t t = blockIdx.x;
  const int32_t target = targets[t];
  const S* row = logits + t * V;
  S* d = dlogits + t * V;
  if (target < 0) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) d[v] = st<S>(0.0f);
    return;
  }
  const float l = lse[t];
  if constexpr (std::is_same_v<S, float>) {
    if (vec4) {
      // 16-byte loads and stores; the row is read once and written once.
      const float4* r4 = reinterpret_cast<const float4*>(row);
      float4* d4 = reinterpret_cast<float4*>(d);
      for (int64_t j = threadIdx.x; j < V / 4; j += blockDim.x) {
        const float4 x = r4[j];
        const int64_t k = int64_t(target) - 4 * j;  // the target's lane in this vector, if any
        d4[j] = make_float4(scale * expf(x.x - l) - (k == 0 ? scale : 0.0f),
                            scale * expf(x.y - l) - (k == 1 ? scale : 0.0f),
                            scale * expf(x.z - l) - (k == 2 ? scale : 0.0f),
                            scale * expf(x.w - l) - (k == 3 ? scale : 0.0f));
      }
      return;
    }
  }
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = scale * expf(ld(row[v]) - l);
    d[v] = st<S>(v == target ? p - scale : p);
  }
}

}  // namespace dhp::cuda::xent
