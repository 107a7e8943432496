// The body of the patch-merge kernel (kernels/cuda/patch_merge.cu launches it) and its launch
// shape, in a header the thread emulator of the tests can compile.
#pragma once

#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda::merge {

constexpr int kThreads = 256;
// Blocks per image along y; each takes every kSlices-th patch of its image. The patch counts
// live on the device, so the grid is sized by images, not patches.
constexpr int kSlices = 64;

inline LaunchDims launch(int n_images) {
  return LaunchDims{unsigned(n_images), kSlices, kThreads, 1};
}

// blockIdx.x = image. The image's first merged row is the sum of the earlier images' merged
// counts (images are few; each block recomputes it). Forward copies patch rows of src into
// merged rows of dst; backward the other way round.
// S: the element type; the merge only moves elements.
template <bool Forward, class S>
__device__ __forceinline__ void merge_block(S* dst, const S* src, const MergeImage* images,
                                            int64_t C, int m) {
  const int i = blockIdx.x;
  int64_t merged0 = 0;
  for (int j = 0; j < i; ++j) merged0 += int64_t(images[j].grid_h / m) * (images[j].grid_w / m);
  const MergeImage im = images[i];
  const int64_t patches = int64_t(im.grid_h) * im.grid_w;
  const int64_t row = int64_t(m) * m * C;
  for (int64_t k = blockIdx.y; k < patches; k += gridDim.y) {
    const int r = int(k / im.grid_w), c = int(k % im.grid_w);
    const int64_t merged = merged0 + int64_t(r / m) * (im.grid_w / m) + c / m;
    const int64_t merged_at = merged * row + int64_t((r % m) * m + (c % m)) * C;
    const int64_t patch_at = (im.patch_offset + k) * C;
    S* d = dst + (Forward ? merged_at : patch_at);
    const S* x = src + (Forward ? patch_at : merged_at);
    for (int64_t e = threadIdx.x; e < C; e += blockDim.x) d[e] = x[e];
  }
}

}  // namespace dhp::cuda::merge
