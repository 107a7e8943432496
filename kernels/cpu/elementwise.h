// Small vector operations the model and optimizer need.
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cpu {

void add_inplace(float* y, const float* x, int64_t n);   // y += x
void scale_inplace(float* y, float s, int64_t n);        // y *= s
// Sum of squares in double, in a fixed order independent of the thread count.
double sum_squares(const float* x, int64_t n);
void fill(float* y, float value, int64_t n);

// Rows of src dropped into the rows of y that `slot` names: y[t] = src[slot[t]] where
// slot[t] >= 0 (image tokens into the decoder stream). y (T, C), src (rows, C).
void scatter_rows(float* y, const float* src, const int32_t* slot, int64_t T, int64_t C);
// The inverse: dsrc[slot[t]] = dy[t] where slot[t] >= 0 (written); other rows of dsrc keep
// their values. Every slot appears at most once.
void gather_rows(float* dsrc, const float* dy, const int32_t* slot, int64_t T, int64_t C);
// Decoupled weight decay: p -= lr·(m̂ / (sqrt(v̂) + eps) + wd·p); wd = 0 for undecayed params.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s);

}  // namespace dhp::cpu
