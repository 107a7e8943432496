// Softmax cross-entropy over rows of logits. A target < 0 means "no loss at this row".
#pragma once

#include <cstdint>

namespace dhp::cpu {

struct CrossEntropyStats {
  double loss_sum = 0.0;   // sum of -log p(target) over rows with a target
  int64_t count = 0;       // rows with a target
  int64_t correct = 0;     // rows whose argmax equals the target
};

// logits (T, V); targets (T); lse (T) saved for the backward pass.
CrossEntropyStats cross_entropy_forward(float* lse, const float* logits, const int32_t* targets,
                                        int64_t T, int64_t V);

// dlogits (T, V) = scale · (softmax - onehot(target)) on rows with a target, 0 elsewhere.
// dlogits may alias logits.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, int64_t T, int64_t V, float scale);

}  // namespace dhp::cpu
