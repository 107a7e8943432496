#include "kernels/cuda/check.h"
#include "kernels/cuda/patch_merge.h"
#include "kernels/cuda/patch_merge_kernels.cuh"

namespace dhp::cuda {
namespace {

template <bool Forward>
__global__ void patch_merge_kernel(float* dst, const float* src, const MergeImage* images,
                                   int64_t C, int m) {
  merge::merge_block<Forward>(dst, src, images, C, m);
}

}  // namespace

void patch_merge_forward(cudaStream_t stream, float* out, const float* in, const MergeImage* images,
                         int n_images, int64_t C, int m) {
  if (n_images <= 0) return;
  const LaunchDims l = merge::launch(n_images);
  patch_merge_kernel<true><<<l.grid(), l.block(), 0, stream>>>(out, in, images, C, m);
  DHP_CUDA_CHECK_LAUNCH();
}

void patch_merge_backward(cudaStream_t stream, float* din, const float* dout,
                          const MergeImage* images, int n_images, int64_t C, int m) {
  if (n_images <= 0) return;
  const LaunchDims l = merge::launch(n_images);
  patch_merge_kernel<false><<<l.grid(), l.block(), 0, stream>>>(din, dout, images, C, m);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
