// Small vector operations on the device (kernels/cpu/elementwise.h is the reference).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/scratch.h"

namespace dhp::cuda {

void add_inplace(cudaStream_t stream, float* y, const float* x, int64_t n);  // y += x
void scale_inplace(cudaStream_t stream, float* y, float s, int64_t n);       // y *= s
void fill(cudaStream_t stream, float* y, float value, int64_t n);

// *out = sum of x² in double; `partial` holds kSumSquaresBlocks doubles (kernels/cuda/scratch.h).
// Two stages with a fixed grid: each block sums a fixed strided share, then one block adds the
// partials in order, so the result never depends on timing.
void sum_squares(cudaStream_t stream, double* out, double* partial, const float* x, int64_t n);

// y[t] = src[slot[t]] where slot[t] >= 0; dsrc[slot[t]] = dy[t] (written). (T, C) rows.
void scatter_rows(cudaStream_t stream, float* y, const float* src, const int32_t* slot, int64_t T,
                  int64_t C);
void gather_rows(cudaStream_t stream, float* dsrc, const float* dy, const int32_t* slot, int64_t T,
                 int64_t C);

// y (T, C) += b (C) on every row.
void add_row_bias(cudaStream_t stream, float* y, const float* b, int64_t T, int64_t C);

// db (C) += column sums of x (T, C), each column summed in a fixed order (no atomics).
void column_sum_add(cudaStream_t stream, float* db, const float* x, int64_t T, int64_t C);

}  // namespace dhp::cuda
