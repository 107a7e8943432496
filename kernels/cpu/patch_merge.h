// The vision path's m x m merge (model-spec.md): with m = 2 each 2x2 block of neighbouring
// patches is concatenated in the order (r,c),(r,c+1),(r+1,c),(r+1,c+1); merged tokens are
// row-major over the merged grid of each image, images one after another. m = 1 is a copy.
// A pure permutation, so the backward pass is the inverse gather (written, not accumulated).
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cpu {

// in (P, C) -> out (P / m², m²·C).
void patch_merge_forward(float* out, const float* in, const MergeImage* images, int n_images,
                         int64_t C, int m);
void patch_merge_backward(float* din, const float* dout, const MergeImage* images, int n_images,
                          int64_t C, int m);

}  // namespace dhp::cpu
