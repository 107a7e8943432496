// The vision path's m x m patch merge on the device (kernels/cpu/patch_merge.h is the
// reference): a permutation of rows, its backward the inverse gather (written).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda {

// in (P, C) -> out (P / m², m²·C); images (n_images) is a device array.
// S: the storage, float or bf16 (kernels/cuda/storage.cuh).
template <class S>
void patch_merge_forward(cudaStream_t stream, S* out, const S* in, const MergeImage* images,
                         int n_images, int64_t C, int m);
template <class S>
void patch_merge_backward(cudaStream_t stream, S* din, const S* dout, const MergeImage* images,
                          int n_images, int64_t C, int m);

}  // namespace dhp::cuda
