// The body of the pixel normalisation kernel (kernels/cuda/pixels.cu launches it) and its
// launch shape, in a header the thread emulator of the tests can compile.
#pragma once

#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda::pixels {

constexpr int kThreads = 256;

inline LaunchDims launch(int64_t n) { return grid_stride(n, kThreads); }

// The CPU's formula, operation for operation (IEEE division and subtraction, no contraction
// possible): the same fp32 value, then one rounding to the storage S.
template <class S>
__device__ __forceinline__ void normalize_block(S* y, const uint8_t* px, int64_t n,
                                                PixelNorm norm) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % 3);
    y[i] = st<S>((float(px[i]) / 255.0f - norm.mean[c]) / norm.std[c]);
  }
}

}  // namespace dhp::cuda::pixels
