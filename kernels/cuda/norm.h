// RMSNorm on the device (kernels/cpu/norm.h is the reference): y = x · rstd · w with
// rstd = 1 / sqrt(mean(x²) + eps). Gradient convention: dw accumulates, dx is written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/storage.cuh"

namespace dhp::cuda {

// x, y (T, C); w (C) in the storage S (float or bf16); rstd (T).
template <class S>
void rmsnorm_forward(cudaStream_t stream, S* y, float* rstd, const S* x, const S* w, int64_t T,
                     int64_t C);
// dw (fp32) is reduced over rows column by column in a fixed order (no atomics): deterministic.
template <class S>
void rmsnorm_backward(cudaStream_t stream, S* dx, float* dw, const S* dy, const S* x, const S* w,
                      const float* rstd, int64_t T, int64_t C);

}  // namespace dhp::cuda
