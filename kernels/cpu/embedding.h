// Token embedding lookup. An id < 0 marks a position filled by something else (an image
// token): its row is zero in the forward pass and it sends no gradient to the table.
#pragma once

#include <cstdint>

namespace dhp::cpu {

// out (T, C) = table[ids]; table (V, C).
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T, int64_t C);
// dtable (V, C) += scatter of dout (T, C) by ids.
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T, int64_t C);

}  // namespace dhp::cpu
