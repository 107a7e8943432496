// The AdamW update on the device, one fused pass over the parameter arena
// (kernels/cpu/elementwise.h adamw_update is the reference).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cuda {

// p -= lr·(m̂ / (sqrt(v̂) + eps) + wd·p); m, v updated in place. p, g, m, v (n).
void adamw_update(cudaStream_t stream, float* p, const float* g, float* m, float* v, int64_t n,
                  const AdamWStep& s);

}  // namespace dhp::cuda
