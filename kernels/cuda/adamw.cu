#include "kernels/cuda/launch.h"
#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/check.h"

namespace dhp::cuda {
namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             adamw::Args a) {
  adamw::update_block(p, g, m, v, n, a);
}

__global__ void adamw4_kernel(float4* p, const float4* g, float4* m, float4* v, int64_t n4,
                              adamw::Args a) {
  adamw::update4_block(p, g, m, v, n4, a);
}

}  // namespace

void adamw_update(cudaStream_t stream, float* p, const float* g, float* m, float* v, int64_t n,
                  const AdamWStep& s) {
  if (n <= 0) return;
  const adamw::Args a = adamw::args_of(s);
  const int64_t done = adamw::vector_part(p, g, m, v, n);
  if (done > 0) {
    const LaunchDims l = adamw::launch(done / 4);
    adamw4_kernel<<<l.grid(), l.block(), 0, stream>>>(
        reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
        reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v), done / 4, a);
    DHP_CUDA_CHECK_LAUNCH();
  }
  if (done < n) {
    const LaunchDims l = adamw::launch(n - done);
    adamw_kernel<<<l.grid(), l.block(), 0, stream>>>(p + done, g + done, m + done, v + done,
                                                     n - done, a);
    DHP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dhp::cuda
