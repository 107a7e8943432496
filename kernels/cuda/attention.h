// Attention over packed variable-length sequences on CUDA devices: the same contract as the
// CPU reference (kernels/cpu/attention.h, which explains the per-token masks and the
// log-sum-exp), so the CUDA backend's Ops forward to these and ring attention merges their
// partial results unchanged. fp32 in and out; every launch goes on `stream` and nothing here
// allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cuda {

// How the products are computed. fp32: plain fp32 arithmetic, as exact as the CPU reference.
// tf32: tensor cores (mma.sync) on operands rounded to TF32 (10 mantissa bits, relative error
// up to 2^-11 per operand) with fp32 accumulation; masks and softmax as in fp32.
enum class AttnMath { fp32, tf32 };

// q (Tq, Hq, hd), k and v (Tk, Hkv, hd) -> out (Tq, Hq, hd), lse (Hq, Tq). Rows that see no
// key get out = 0 and lse = -inf. Tiles the mask hides entirely are not computed.
void attention_forward(cudaStream_t stream, float* out, float* lse, const float* q, const float* k,
                       const float* v, AttnMeta qm, AttnMeta km, const AttnShape& s,
                       AttnMath math = AttnMath::fp32);

// dq (Tq, Hq, hd), dk and dv (Tk, Hkv, hd) are written (=), from the forward's out and lse.
void attention_backward(cudaStream_t stream, float* dq, float* dk, float* dv, const float* dout,
                        const float* out, const float* lse, const float* q, const float* k,
                        const float* v, AttnMeta qm, AttnMeta km, const AttnShape& s,
                        AttnMath math = AttnMath::fp32);

// Merges part b (part_out (T, H, hd), part_lse (H, T)) into a (out, lse) in place
// (kernels/cpu/attention_merge.h).
void attention_merge(cudaStream_t stream, float* out, float* lse, const float* part_out,
                     const float* part_lse, int64_t T, int H, int hd);

}  // namespace dhp::cuda
