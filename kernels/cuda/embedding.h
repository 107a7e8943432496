// Token embedding lookup on the device (kernels/cpu/embedding.h is the reference). An id < 0
// gives a zero row and sends no gradient.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dhp::cuda {

// out (T, C) = table[ids]; table (V, C).
void embedding_forward(cudaStream_t stream, float* out, const int32_t* ids, const float* table,
                       int64_t T, int64_t C);
// dtable (V, C) += scatter of dout (T, C) by ids. The first row holding an id adds every row
// holding it, in row order: deterministic and free of atomics.
void embedding_backward(cudaStream_t stream, float* dtable, const float* dout, const int32_t* ids,
                        int64_t T, int64_t C);

}  // namespace dhp::cuda
