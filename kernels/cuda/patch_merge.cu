#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/patch_merge_kernels.cuh"

namespace dhp::cuda {
namespace {

template <bool Forward, class S>
__global__ void patch_merge_kernel(S* dst, const S* src, const MergeImage* images, int64_t C,
                                   int m) {
  merge::merge_block<Forward>(dst, src, images, C, m);
}

}  // namespace

template <class S>
void patch_merge_forward(cudaStream_t stream, S* out, const S* in, const MergeImage* images,
                         int n_images, int64_t C, int m) {
  if (n_images <= 0) return;
  const LaunchDims l = merge::launch(n_images);
  patch_merge_kernel<true, S><<<l.grid(), l.block(), 0, stream>>>(out, in, images, C, m);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void patch_merge_backward(cudaStream_t stream, S* din, const S* dout, const MergeImage* images,
                          int n_images, int64_t C, int m) {
  if (n_images <= 0) return;
  const LaunchDims l = merge::launch(n_images);
  patch_merge_kernel<false, S><<<l.grid(), l.block(), 0, stream>>>(din, dout, images, C, m);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_MERGE_INSTANCES(S)                                                                 \
  template void patch_merge_forward<S>(cudaStream_t, S*, const S*, const MergeImage*, int,      \
                                       int64_t, int);                                           \
  template void patch_merge_backward<S>(cudaStream_t, S*, const S*, const MergeImage*, int,     \
                                        int64_t, int);
DHP_MERGE_INSTANCES(float)
DHP_MERGE_INSTANCES(bf16)
#undef DHP_MERGE_INSTANCES

}  // namespace dhp::cuda
