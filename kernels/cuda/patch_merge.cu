#include "kernels/cuda/check.h"
#include "kernels/cuda/patch_merge.h"
#include "kernels/cuda/reduce.cuh"

namespace dhp::cuda {
namespace {

constexpr int kThreads = 256;
// Blocks per image along y; each takes every kSlices-th patch of its image. The patch counts
// live on the device, so the grid is sized by images, not patches.
constexpr int kSlices = 64;

// blockIdx.x = image. The image's first merged row is the sum of the earlier images' merged
// counts (images are few; each block recomputes it). Forward copies patch rows of src into
// merged rows of dst; backward the other way round.
template <bool Forward>
__global__ void patch_merge_kernel(float* dst, const float* src, const MergeImage* images,
                                   int64_t C, int m) {
  const int i = blockIdx.x;
  int64_t merged0 = 0;
  for (int j = 0; j < i; ++j)
    merged0 += int64_t(images[j].grid_h / m) * (images[j].grid_w / m);
  const MergeImage im = images[i];
  const int64_t patches = int64_t(im.grid_h) * im.grid_w;
  const int64_t row = int64_t(m) * m * C;
  for (int64_t k = blockIdx.y; k < patches; k += gridDim.y) {
    const int r = int(k / im.grid_w), c = int(k % im.grid_w);
    const int64_t merged = merged0 + int64_t(r / m) * (im.grid_w / m) + c / m;
    const int64_t merged_at = merged * row + int64_t((r % m) * m + (c % m)) * C;
    const int64_t patch_at = (im.patch_offset + k) * C;
    float* d = dst + (Forward ? merged_at : patch_at);
    const float* x = src + (Forward ? patch_at : merged_at);
    for (int64_t e = threadIdx.x; e < C; e += blockDim.x) d[e] = x[e];
  }
}

}  // namespace

void patch_merge_forward(cudaStream_t stream, float* out, const float* in,
                         const MergeImage* images, int n_images, int64_t C, int m) {
  if (n_images <= 0) return;
  patch_merge_kernel<true><<<dim3(unsigned(n_images), kSlices), kThreads, 0, stream>>>(
      out, in, images, C, m);
  DHP_CUDA_CHECK_LAUNCH();
}

void patch_merge_backward(cudaStream_t stream, float* din, const float* dout,
                          const MergeImage* images, int n_images, int64_t C, int m) {
  if (n_images <= 0) return;
  patch_merge_kernel<false><<<dim3(unsigned(n_images), kSlices), kThreads, 0, stream>>>(
      din, dout, images, C, m);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
