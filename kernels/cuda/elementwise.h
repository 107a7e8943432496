// Small vector operations on the device (kernels/cpu/elementwise.h is the reference).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/scratch.h"
#include "kernels/cuda/storage.cuh"

namespace dhp::cuda {

// S: the storage, float or bf16 (kernels/cuda/storage.cuh).
template <class S>
void add_inplace(cudaStream_t stream, S* y, const S* x, int64_t n);  // y += x
// acc (fp32) += x.
template <class S>
void accumulate(cudaStream_t stream, float* acc, const S* x, int64_t n);
void scale_inplace(cudaStream_t stream, float* y, float s, int64_t n);  // y *= s
template <class S>
void fill(cudaStream_t stream, S* y, float value, int64_t n);
// y = x, rounded to nearest even.
void cast(cudaStream_t stream, bf16* y, const float* x, int64_t n);

// *out = sum of x² in double; `partial` holds kSumSquaresBlocks doubles (kernels/cuda/scratch.h).
// Two stages with a fixed grid: each block sums a fixed strided share, then one block adds the
// partials in order, so the result never depends on timing.
void sum_squares(cudaStream_t stream, double* out, double* partial, const float* x, int64_t n);

// y[t] = src[slot[t]] where slot[t] >= 0; dsrc[slot[t]] = dy[t] (written). (T, C) rows.
template <class S>
void scatter_rows(cudaStream_t stream, S* y, const S* src, const int32_t* slot, int64_t T,
                  int64_t C);
template <class S>
void gather_rows(cudaStream_t stream, S* dsrc, const S* dy, const int32_t* slot, int64_t T,
                 int64_t C);

// y (T, C) += b (C) on every row.
template <class S>
void add_row_bias(cudaStream_t stream, S* y, const S* b, int64_t T, int64_t C);

// db (C, fp32) += column sums of x (T, C), each column summed in a fixed order (no atomics).
template <class S>
void column_sum_add(cudaStream_t stream, float* db, const S* x, int64_t T, int64_t C);

}  // namespace dhp::cuda
