// Softmax cross-entropy over rows of logits on the device (kernels/cpu/cross_entropy.h is the
// reference). A target < 0 means "no loss at this row".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/scratch.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda {

// logits (T, V); targets (T); lse (T) written. One fused pass per row finds the max, the
// argmax and the sum of exponentials (online); the rows' statistics are then added to *stats
// in row-independent fixed order, kCrossEntropyRows rows at a time through `rows`
// (kernels/cuda/scratch.h).
// S: the storage of the logits, float or bf16.
template <class S>
void cross_entropy_forward(cudaStream_t stream, float* lse, CrossEntropyStats* stats,
                           CrossEntropyRow* rows, const S* logits, const int32_t* targets,
                           int64_t T, int64_t V);

// dlogits (T, V) = scale · (softmax - onehot(target)) on rows with a target, 0 elsewhere,
// from the forward's lse: one read of the logits, one write. dlogits may alias logits.
template <class S>
void cross_entropy_backward(cudaStream_t stream, S* dlogits, const S* logits, const float* lse,
                            const int32_t* targets, int64_t T, int64_t V, float scale);

}  // namespace dhp::cuda
