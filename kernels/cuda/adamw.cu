#include <cmath>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/reduce.cuh"

namespace dhp::cuda {
namespace {

constexpr int kThreads = 256;

struct AdamWArgs {
  float beta1, beta2, eps, lr_wd, step, inv_bc2;
};

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             AdamWArgs a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi * a.inv_bc2) + a.eps;
    p[i] -= a.step * mi / denom + a.lr_wd * p[i];
  }
}

}  // namespace

void adamw_update(cudaStream_t stream, float* p, const float* g, float* m, float* v, int64_t n,
                  const AdamWStep& s) {
  if (n <= 0) return;
  // Bias corrections on the host in double, rounded as the CPU reference rounds them.
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.t));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.t));
  const AdamWArgs a{s.beta1, s.beta2, s.eps, s.lr * s.weight_decay, float(s.lr / bc1),
                    float(1.0 / bc2)};
  adamw_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(p, g, m, v, n, a);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
