// Token embedding lookup on the device (kernels/cpu/embedding.h is the reference). An id < 0
// gives a zero row and sends no gradient.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/storage.cuh"

namespace dhp::cuda {

// out (T, C) = table[ids]; table (V, C); both in the storage S (float or bf16).
template <class S>
void embedding_forward(cudaStream_t stream, S* out, const int32_t* ids, const S* table, int64_t T,
                       int64_t C);
// dtable (V, C) += scatter of dout (T, C) by ids. The first row holding an id adds every row
// holding it, in row order: deterministic and free of atomics.
template <class S>
void embedding_backward(cudaStream_t stream, float* dtable, const S* dout, const int32_t* ids,
                        int64_t T, int64_t C);

}  // namespace dhp::cuda
