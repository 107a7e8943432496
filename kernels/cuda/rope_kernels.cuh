// The body of the RoPE kernel (kernels/cuda/rope.cu launches it) and its launch shape, in a
// header the thread emulator of the tests can compile.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/rope_spec.h"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda::rope {

constexpr int kThreads = 256;

// One thread per (token, pair) of the span: n = T · span / 2.
inline LaunchDims launch(int64_t n) { return grid_stride(n, kThreads); }

// The angle is computed once and applied to every head. Frequencies and angles in double as on
// the CPU (the same rope_inv_freq): positions reach 1e5 and float loses the phase there.
template <class S>
__device__ __forceinline__ void rotate_block(S* x, const int32_t* pos, int64_t T, int H, int hd,
                                             int offset, int span, const RopeSpec& rope,
                                             float sign) {
  const int half = span / 2;
  const int64_t n = T * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = k / half;
    const int i = int(k % half);
    const double a = double(rope_position(rope, pos, t, i)) * rope_pair_freq(rope, i, span);
    const float c = float(cos(a)), s = sign * float(sin(a));
    for (int h = 0; h < H; ++h) {
      S* v = x + (t * H + h) * hd + offset;
      const float x0 = ld(v[i]), x1 = ld(v[i + half]);
      v[i] = st<S>(x0 * c - x1 * s);
      v[i + half] = st<S>(x0 * s + x1 * c);
    }
  }
}

}  // namespace dhp::cuda::rope
