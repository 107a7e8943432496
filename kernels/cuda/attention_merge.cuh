// The body of the log-sum-exp merge kernel (kernels/cpu/attention_merge.h for the formula),
// apart from its __global__ wrapper in attention.cu so that the CPU emulator of the tests runs
// it too.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::attn {

constexpr int kMergeThreads = 256;  // 8 rows per block

// One warp per (token, head) row of out (T, H, hd) and lse (H, T): every lane reads both
// log-sum-exps before lane 0 writes the merged one (the warp meets at __syncwarp first), so no
// lane reads a half-updated row.
template <class S>
__device__ __forceinline__ void merge_block(float* out, float* lse, const S* part_out,
                                            const float* part_lse, int64_t T, int H, int hd) {
  const int64_t row = (int64_t(blockIdx.x) * kMergeThreads + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= T * int64_t(H)) return;  // whole warps: kMergeThreads is a multiple of 32
  const int64_t t = row / H, h = row % H;
  float* a = lse + h * T + t;
  const float la = *a, lb = part_lse[h * T + t];
  __syncwarp();
  if (lb == -INFINITY) return;  // part b saw no key: nothing to add
  float* o = out + row * hd;
  const S* po = part_out + row * hd;
  if (la == -INFINITY) {
    for (int i = lane; i < hd; i += 32) o[i] = ld(po[i]);
    if (lane == 0) *a = lb;
    return;
  }
  const float m = fmaxf(la, lb);
  const float wa = expf(la - m), wb = expf(lb - m), s = wa + wb;
  for (int i = lane; i < hd; i += 32) o[i] = (wa * o[i] + wb * ld(po[i])) / s;
  if (lane == 0) *a = m + logf(s);
}

}  // namespace dhp::cuda::attn
