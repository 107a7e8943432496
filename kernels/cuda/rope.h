// Rotary position embedding on the device, in place (kernels/cpu/rope.h is the reference:
// half-split pairs, angles in double, the backward pass is the inverse rotation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/storage.cuh"

namespace dhp::cuda {

// x (T, H, hd); the span [offset, offset + span) of every head rotates by pos (T).
// sign = +1 forward, -1 backward.
template <class S>
void rope_rotate(cudaStream_t stream, S* x, const int32_t* pos, int64_t T, int H, int hd,
                 int offset, int span, double theta, float sign);

template <class S>
void rope_forward(cudaStream_t stream, S* x, const int32_t* pos, int64_t T, int H, int hd,
                  double theta);
template <class S>
void rope_backward(cudaStream_t stream, S* dx, const int32_t* pos, int64_t T, int H, int hd,
                   double theta);
// 2-D: the first half of each head by row, the second by col.
template <class S>
void rope2d_forward(cudaStream_t stream, S* x, const int32_t* row, const int32_t* col,
                    int64_t T, int H, int hd, double theta);
template <class S>
void rope2d_backward(cudaStream_t stream, S* dx, const int32_t* row, const int32_t* col,
                     int64_t T, int H, int hd, double theta);

}  // namespace dhp::cuda
