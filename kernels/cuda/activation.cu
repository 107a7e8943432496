#include "kernels/cuda/activation.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/reduce.cuh"

namespace dhp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi), as on the CPU
constexpr float kGeluA = 0.044715f;

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void swiglu_forward_kernel(float* h, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    h[i] = a[i] * sigmoid(a[i]) * b[i];
}

__global__ void swiglu_backward_kernel(float* da, float* db, const float* dh, const float* a,
                                       const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float s = sigmoid(a[i]);
    const float silu = a[i] * s;
    // Read everything before writing: da may alias dh.
    const float g = dh[i], bi = b[i];
    db[i] = g * silu;
    da[i] = g * bi * (s + silu * (1.0f - s));
  }
}

__global__ void gelu_forward_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
  }
}

__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float th = tanhf(kGeluC * (v + kGeluA * v * v * v));
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
  }
}

}  // namespace

void swiglu_forward(cudaStream_t stream, float* h, const float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  swiglu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(h, a, b, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(cudaStream_t stream, float* da, float* db, const float* dh, const float* a,
                     const float* b, int64_t n) {
  if (n <= 0) return;
  swiglu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(da, db, dh, a, b, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void gelu_forward(cudaStream_t stream, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void gelu_backward(cudaStream_t stream, float* dx, const float* dy, const float* x, int64_t n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dx, dy, x, n);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
