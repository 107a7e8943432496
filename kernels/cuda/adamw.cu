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

__device__ inline void adamw_one(float& p, float g, float& m, float& v, const AdamWArgs& a) {
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  const float denom = sqrtf(v * a.inv_bc2) + a.eps;
  p -= a.step * m / denom + a.lr_wd * p;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             AdamWArgs a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, g[i], mi, vi, a);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// Four elements per thread with 16-byte loads: the update reads and writes 4 arrays of the
// whole parameter arena, so it is bound by memory bandwidth.
__global__ void adamw4_kernel(float4* p, const float4* g, float4* m, float4* v, int64_t n4,
                              AdamWArgs a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    adamw_one(pi.x, gi.x, mi.x, vi.x, a);
    adamw_one(pi.y, gi.y, mi.y, vi.y, a);
    adamw_one(pi.z, gi.z, mi.z, vi.z, a);
    adamw_one(pi.w, gi.w, mi.w, vi.w, a);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
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
  int64_t done = 0;
  if (aligned16(p, g, m, v) && n >= 4) {
    const int64_t n4 = n / 4;
    adamw4_kernel<<<blocks_for(n4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
        reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v), n4, a);
    DHP_CUDA_CHECK_LAUNCH();
    done = n4 * 4;
  }
  if (done < n) {
    adamw_kernel<<<blocks_for(n - done, kThreads), kThreads, 0, stream>>>(p + done, g + done,
                                                                          m + done, v + done,
                                                                          n - done, a);
    DHP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dhp::cuda
