// The bodies of the LayerScale kernels (kernels/cuda/channel_scale.cu launches them) and their
// launch shapes; the CPU reference is kernels/cpu/channel_scale.h. Each body takes its shared
// memory as an argument, so the thread emulator of the tests can run it on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::channel_scale {

constexpr int kThreads = 256;
// dw: 32 columns per block, 16 row lanes combined in lane order.
constexpr int kColTile = 32, kRowLanes = 16;
struct ParamShared {
  float w[kRowLanes][kColTile];
};

inline LaunchDims elements_launch(int64_t n) { return grid_stride(n, kThreads); }
inline LaunchDims params_launch(int64_t C) {
  return LaunchDims{unsigned((C + kColTile - 1) / kColTile), 1, kColTile, kRowLanes};
}

// y = x · w[column] over n = T·C values, grid-stride; y may alias x (so may dx and dy: the
// backward's dx = dy · w is this body too).
template <class S>
__device__ __forceinline__ void scale_block(S* y, const S* x, const S* w, int64_t n, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = st<S>(ld(x[i]) * ld(w[i % C]));
}

// dw[c] += sum over rows of dy · x: each block 32 columns, its 16 row lanes summed in lane order
// (no atomics): deterministic.
template <class S>
__device__ __forceinline__ void params_block(float* dw, const S* dy, const S* x, int64_t T, int64_t C,
                                             ParamShared& part) {
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (int64_t t = threadIdx.y; t < T; t += kRowLanes) s += ld(dy[t * C + c]) * ld(x[t * C + c]);
  part.w[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int r = 0; r < kRowLanes; ++r) total += part.w[r][threadIdx.x];
    dw[c] += total;
  }
}

}  // namespace dhp::cuda::channel_scale
