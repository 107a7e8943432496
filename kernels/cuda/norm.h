// RMSNorm on the device (kernels/cpu/norm.h is the reference): y = x · rstd · w with
// rstd = 1 / sqrt(mean(x²) + eps). Gradient convention: dw accumulates, dx is written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dhp::cuda {

// x, y (T, C); w (C); rstd (T).
void rmsnorm_forward(cudaStream_t stream, float* y, float* rstd, const float* x, const float* w,
                     int64_t T, int64_t C);
// dw is reduced over rows column by column in a fixed order (no atomics): deterministic.
void rmsnorm_backward(cudaStream_t stream, float* dx, float* dw, const float* dy, const float* x,
                      const float* w, const float* rstd, int64_t T, int64_t C);

}  // namespace dhp::cuda
