// Blocked (flash-style) attention over packed variable-length sequences, on the CPU.
//
// Masks are described per token instead of as a dense matrix, so a pack of any length costs
// O(T) to describe and fully hidden tiles are skipped without being computed:
//   query q may see key k  <=>  doc[q] == doc[k]  and  (idx[k] <= idx[q]  or
//                                                       blk[q] >= 0 and blk[q] == blk[k])
// doc separates packed documents (and images in the vision encoder), idx orders tokens for the
// causal rule, blk >= 0 marks a bidirectional block (an image). Query and key sides carry
// their own metadata so that ring attention can feed a remote K/V chunk with its own positions.
//
// The forward pass returns the log-sum-exp of every (head, query) row besides the output, so
// partial results over disjoint key sets can be merged exactly:
//   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse)·out_a + exp(lse_b - lse)·out_b.
// A row that sees no key has out = 0 and lse = -inf.
// Grouped-query attention: query head h reads kv head h / (Hq / Hkv).
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cpu {

// q (Tq, Hq, hd), k and v (Tk, Hkv, hd) -> out (Tq, Hq, hd), lse (Hq, Tq).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       AttnMeta qm, AttnMeta km, const AttnShape& s);

// Gradients dq (Tq, Hq, hd), dk and dv (Tk, Hkv, hd) are written (=).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        AttnMeta qm, AttnMeta km, const AttnShape& s);

}  // namespace dhp::cpu
