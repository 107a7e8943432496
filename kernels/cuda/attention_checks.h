// Host-side argument checks of the CUDA attention entry points, compiled by the host compiler
// (attention_checks.cpp): .cu files include nothing of fmt (kernels/cuda/check.h says why).
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cuda {

// Throws dhp::Error naming the shape when the kernels cannot run it: `tile` is the kernels'
// tile size, `head_dim_supported` whether s.hd has an instance.
void check_attention_shape(const AttnShape& s, int64_t tile, bool head_dim_supported);
// The merge's rows (T·H) must fit `blocks` launch blocks of one grid dimension.
void check_merge_shape(int64_t T, int H, int hd, int64_t blocks);
// A dispatch case the checks above rule out: a bug.
[[noreturn]] void unreachable(const char* what);

}  // namespace dhp::cuda
