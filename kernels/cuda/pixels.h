// Pixel normalisation on the device (kernels/cpu/pixels.h is the reference): a batch travels
// to the device as 8-bit pixels, a quarter of the bytes of fp32 patches, and becomes the
// vision encoder's input in its storage here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda {

// y (n, storage S: float or bf16) from pixels (n, channel fastest).
template <class S>
void normalize_pixels(cudaStream_t stream, S* y, const uint8_t* pixels, int64_t n,
                      const PixelNorm& norm);

}  // namespace dhp::cuda
