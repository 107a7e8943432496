// The vision path's m x m patch merge on the device (kernels/cpu/patch_merge.h is the
// reference): a permutation of rows, its backward the inverse gather (written).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cuda {

// in (P, C) -> out (P / m², m²·C); images (n_images) is a device array.
void patch_merge_forward(cudaStream_t stream, float* out, const float* in,
                         const MergeImage* images, int n_images, int64_t C, int m);
void patch_merge_backward(cudaStream_t stream, float* din, const float* dout,
                          const MergeImage* images, int n_images, int64_t C, int m);

}  // namespace dhp::cuda
