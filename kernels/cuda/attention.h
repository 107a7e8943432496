// Attention over packed variable-length sequences on CUDA devices: the same contract as the
// CPU reference (kernels/cpu/attention.h, which explains the per-token masks and the
// log-sum-exp), so the CUDA backend's Ops forward to these and ring attention merges their
// partial results unchanged. Head vectors in fp32 or bf16 storage (S), lse in fp32; every
// launch goes on `stream` and nothing here allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda {

// How the products are computed. fp32: plain fp32 arithmetic, as exact as the CPU reference.
// tf32: tensor cores (mma.sync) on operands rounded to TF32 (10 mantissa bits, relative error
// up to 2^-11 per operand) with fp32 accumulation; masks and softmax as in fp32.
enum class AttnMath { fp32, tf32 };

// q (Tq, Hq, hd), k and v (Tk, Hkv, hd) -> out (Tq, Hq, hd), lse (Hq, Tq). Rows that see no
// key get out = 0 and lse = -inf. Tiles the mask hides entirely are not computed. bf16
// storage always takes the tensor-core path (bf16 values are exact in TF32).
template <class S>
void attention_forward(cudaStream_t stream, S* out, float* lse, const S* q, const S* k,
                       const S* v, AttnMeta qm, AttnMeta km, const AttnShape& s,
                       AttnMath math = AttnMath::fp32);

// dq (Tq, Hq, hd), dk and dv (Tk, Hkv, hd) are written (=), from the forward's out and lse.
template <class S>
void attention_backward(cudaStream_t stream, S* dq, S* dk, S* dv, const S* dout, const S* out,
                        const float* lse, const S* q, const S* k, const S* v, AttnMeta qm,
                        AttnMeta km, const AttnShape& s, AttnMath math = AttnMath::fp32);

// Merges part b (part_out (T, H, hd), part_lse (H, T)) into a (out, lse) in place
// (kernels/cpu/attention_merge.h).
// out and lse are the fp32 running result; part_out in the storage S.
template <class S>
void attention_merge(cudaStream_t stream, float* out, float* lse, const S* part_out,
                     const float* part_lse, int64_t T, int H, int hd);

}  // namespace dhp::cuda
