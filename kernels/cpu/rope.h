// Rotary position embedding, "half-split" convention (model-spec.md): within a span of `span`
// values starting at `offset` of every head vector, pair i rotates (x[i], x[i + span/2]) by
// angle pos · rope_inv_freq(rope, i, span) (kernels/rope_spec.h: theta^(-2i/span), rescaled
// under Llama-3.x's scaling). 1-D RoPE is one span over the whole head; the vision encoder's
// 2-D RoPE is the first half rotated by the patch row and the second by the patch column.
// Under M-RoPE (RopeSpec::mrope_section) pos holds three positions per token and each pair
// takes the one of its axis (kernels/rope_spec.h).
// The backward pass is the inverse rotation. Both work in place.
#pragma once

#include <cstdint>

#include "kernels/rope_spec.h"

namespace dhp::cpu {

// x (T, H, hd); pos (T), or (T, 3) under M-RoPE.
void rope_forward(float* x, const int32_t* pos, int64_t T, int H, int hd, int offset, int span,
                  const RopeSpec& rope);
void rope_backward(float* dx, const int32_t* pos, int64_t T, int H, int hd, int offset, int span,
                   const RopeSpec& rope);

// 2-D: first half of each head by row, second half by col.
void rope2d_forward(float* x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                    const RopeSpec& rope);
void rope2d_backward(float* dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                     const RopeSpec& rope);

}  // namespace dhp::cpu
