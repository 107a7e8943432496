#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/vision_embed_kernels.cuh"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void vision_embed_forward_kernel(S* x, const S* table, const S* cls,
                                            const PosImage* images, int n_images, int64_t C,
                                            int g0h, int g0w, PosResize resize) {
  vembed::forward_block(x, table, cls, images, n_images, C, g0h, g0w, resize);
}

template <class S>
__global__ void vision_embed_backward_kernel(float* dtable, float* dcls, const S* dx,
                                             const PosImage* images, int n_images, int64_t C,
                                             int g0h, int g0w, PosResize resize) {
  vembed::backward_block(dtable, dcls, dx, images, n_images, C, g0h, g0w, resize);
}

}  // namespace

template <class S>
void vision_embed_forward(cudaStream_t stream, S* x, const S* table, const S* cls,
                          const PosImage* images, int n_images, int64_t C, int g0h, int g0w, PosResize resize) {
  if (n_images <= 0 || C <= 0) return;
  const LaunchDims l = vembed::forward_launch(C, n_images);
  vision_embed_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(x, table, cls, images,
                                                                  n_images, C, g0h, g0w, resize);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void vision_embed_backward(cudaStream_t stream, float* dtable, float* dcls, const S* dx,
                           const PosImage* images, int n_images, int64_t C, int g0h, int g0w, PosResize resize) {
  if (n_images <= 0 || C <= 0 || (!dtable && !dcls)) return;
  const int64_t rows = dtable ? (dcls ? 1 : 0) + int64_t(g0h) * g0w : 1;
  const LaunchDims l = vembed::backward_launch(C, rows);
  vision_embed_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(dtable, dcls, dx, images,
                                                                   n_images, C, g0h, g0w, resize);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_VISION_EMBED_INSTANCES(S)                                                          \
  template void vision_embed_forward<S>(cudaStream_t, S*, const S*, const S*, const PosImage*, \
                                        int, int64_t, int, int, PosResize);                    \
  template void vision_embed_backward<S>(cudaStream_t, float*, float*, const S*,               \
                                         const PosImage*, int, int64_t, int, int, PosResize);
DHP_VISION_EMBED_INSTANCES(float)
DHP_VISION_EMBED_INSTANCES(bf16)
#undef DHP_VISION_EMBED_INSTANCES

}  // namespace dhp::cuda
