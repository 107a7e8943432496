#include "kernels/cpu/norm.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/reduce.cuh"

namespace dhp::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row.
__global__ void rmsnorm_forward_kernel(float* y, float* rstd, const float* x, const float* w,
                                       int64_t C) {
  __shared__ float shared[kWarp];
  const int64_t t = blockIdx.x;
  const float* xt = x + t * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xt[c] * xt[c];
  ss = block_sum(ss, shared);
  const float r = 1.0f / sqrtf(ss / float(C) + cpu::kRmsEps);
  if (threadIdx.x == 0) rstd[t] = r;
  float* yt = y + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yt[c] = xt[c] * r * w[c];
}

// dx = rstd · (g - n · mean(g·n)) with g = w·dy, n = x·rstd. One block per row.
__global__ void rmsnorm_dx_kernel(float* dx, const float* dy, const float* x, const float* w,
                                  const float* rstd, int64_t C) {
  __shared__ float shared[kWarp];
  const int64_t t = blockIdx.x;
  const float* xt = x + t * C;
  const float* dyt = dy + t * C;
  const float r = rstd[t];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * dyt[c] * xt[c] * r;
  const float mean = block_sum(dot, shared) / float(C);
  float* dxt = dx + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dxt[c] = r * (w[c] * dyt[c] - xt[c] * r * mean);
}

// dw[c] += sum_t dy·x·rstd: 32 columns per block, 16 row lanes combined in lane order.
constexpr int kColTile = 32, kRowLanes = 16;

__global__ void rmsnorm_dw_kernel(float* dw, const float* dy, const float* x, const float* rstd,
                                  int64_t T, int64_t C) {
  __shared__ float part[kRowLanes][kColTile];
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (int64_t t = threadIdx.y; t < T; t += kRowLanes) s += dy[t * C + c] * x[t * C + c] * rstd[t];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int r = 0; r < kRowLanes; ++r) total += part[r][threadIdx.x];
    dw[c] += total;
  }
}

}  // namespace

void rmsnorm_forward(cudaStream_t stream, float* y, float* rstd, const float* x, const float* w,
                     int64_t T, int64_t C) {
  if (T <= 0) return;
  rmsnorm_forward_kernel<<<unsigned(T), kThreads, 0, stream>>>(y, rstd, x, w, C);
  DHP_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(cudaStream_t stream, float* dx, float* dw, const float* dy, const float* x,
                      const float* w, const float* rstd, int64_t T, int64_t C) {
  if (T <= 0) return;
  // dw first: dx may alias dy (the model reuses gradient buffers).
  rmsnorm_dw_kernel<<<unsigned((C + kColTile - 1) / kColTile), dim3(kColTile, kRowLanes), 0,
                      stream>>>(dw, dy, x, rstd, T, C);
  DHP_CUDA_CHECK_LAUNCH();
  rmsnorm_dx_kernel<<<unsigned(T), kThreads, 0, stream>>>(dx, dy, x, w, rstd, C);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
