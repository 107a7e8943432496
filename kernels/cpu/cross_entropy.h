// Softmax cross-entropy over rows of logits. A target < 0 means "no loss at this row".
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cpu {

// logits (T, V); targets (T); lse (T) saved for the backward pass. Returns the rows'
// statistics, summed in row order (independent of the thread count).
CrossEntropyStats cross_entropy_forward(float* lse, const float* logits, const int32_t* targets,
                                        int64_t T, int64_t V);

// dlogits (T, V) = scale · (softmax - onehot(target)) on rows with a target, 0 elsewhere.
// dlogits may alias logits.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, int64_t T, int64_t V, float scale);

}  // namespace dhp::cpu
