#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pixels_kernels.cuh"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void normalize_kernel(S* y, const uint8_t* px, int64_t n, PixelNorm norm) {
  pixels::normalize_block(y, px, n, norm);
}

}  // namespace

template <class S>
void normalize_pixels(cudaStream_t stream, S* y, const uint8_t* px, int64_t n,
                      const PixelNorm& norm) {
  if (n <= 0) return;
  const LaunchDims l = pixels::launch(n);
  normalize_kernel<<<l.grid(), l.block(), 0, stream>>>(y, px, n, norm);
  DHP_CUDA_CHECK_LAUNCH();
}

template void normalize_pixels<float>(cudaStream_t, float*, const uint8_t*, int64_t,
                                      const PixelNorm&);
template void normalize_pixels<bf16>(cudaStream_t, bf16*, const uint8_t*, int64_t,
                                     const PixelNorm&);

}  // namespace dhp::cuda
