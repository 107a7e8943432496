// Merging partial attention results over disjoint key sets (ring attention: one key block per
// ring step). With each part's log-sum-exp per (head, query) row,
//   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse)·out_a + exp(lse_b - lse)·out_b,
// exactly the attention over the union of the key sets. A part whose row saw no key has
// lse = -inf and contributes nothing.
#pragma once

#include <cstdint>

namespace dhp::cpu {

// out (T, H, hd) and lse (H, T) hold part a and receive the merge; part b is (part_out,
// part_lse) of the same shapes.
void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse,
                     int64_t T, int H, int hd);

}  // namespace dhp::cpu
