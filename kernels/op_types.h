// Plain descriptions of op arguments, shared by every backend. Pointers inside them are
// device pointers of the backend the op runs on.
#pragma once

#include <cstdint>

namespace dhp {

// Per-token attention metadata (kernels/cpu/attention.h explains the mask):
//   query q may see key k  <=>  doc[q] == doc[k]  and  (idx[k] <= idx[q]  or
//                                                       blk[q] >= 0 and blk[q] == blk[k])
struct AttnMeta {
  const int32_t* doc;  // (T)
  const int32_t* idx;  // (T)
  const int32_t* blk;  // (T), -1 = not in a bidirectional block
};

struct AttnShape {
  int64_t Tq, Tk;
  int Hq, Hkv, hd;
  float scale;  // usually 1 / sqrt(hd)
};

// One image of the m x m patch merge.
struct MergeImage {
  int64_t patch_offset;  // first patch row of the image in the input
  int grid_h, grid_w;    // patch grid; both multiples of m
};

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t t;  // 1-based step for bias correction
};

// What cross_entropy_forward adds to its statistics buffer: three doubles, in this order.
struct CrossEntropyStats {
  double loss_sum = 0.0;  // sum of -log p(target) over rows with a target
  double count = 0.0;     // rows with a target
  double correct = 0.0;   // rows whose argmax equals the target
};
static_assert(sizeof(CrossEntropyStats) == 3 * sizeof(double));

}  // namespace dhp
