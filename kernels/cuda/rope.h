// Rotary position embedding on the device, in place (kernels/cpu/rope.h is the reference:
// half-split pairs, angles in double, the backward pass is the inverse rotation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dhp::cuda {

// x (T, H, hd); the span [offset, offset + span) of every head rotates by pos (T).
// sign = +1 forward, -1 backward.
void rope_rotate(cudaStream_t stream, float* x, const int32_t* pos, int64_t T, int H, int hd,
                 int offset, int span, double theta, float sign);

void rope_forward(cudaStream_t stream, float* x, const int32_t* pos, int64_t T, int H, int hd,
                  double theta);
void rope_backward(cudaStream_t stream, float* dx, const int32_t* pos, int64_t T, int H, int hd,
                   double theta);
// 2-D: the first half of each head by row, the second by col.
void rope2d_forward(cudaStream_t stream, float* x, const int32_t* row, const int32_t* col,
                    int64_t T, int H, int hd, double theta);
void rope2d_backward(cudaStream_t stream, float* dx, const int32_t* row, const int32_t* col,
                     int64_t T, int H, int hd, double theta);

}  // namespace dhp::cuda
