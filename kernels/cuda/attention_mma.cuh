// Tensor-core products of the attention kernels' TF32 variant: warp-level mma.m16n8k8 on
// operands rounded to TF32 (10 mantissa bits), accumulating in fp32. Operands come from the
// shared-memory tiles of attention_kernels.cuh: head vectors in rows of S floats, scores in
// rows of SS.
//
// Fragment layout of m16n8k8 (PTX ISA), lane = 4·g + t: A (16 x 8, row-major) a0 (g, t),
// a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B (8 x 8, k x n) b0 (t, g), b1 (t+4, g); C (16 x 8)
// c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_tiles.cuh"

namespace dhp::cuda::attn {

#if defined(__CUDACC__)
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// d += a · b over one 16 x 8 x 8 step, collectively by the warp.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
// Compiled by the host compiler only under the CPU emulator of the tests, which provides both.
using ::dhp::emu::mma_tf32;
using ::dhp::emu::to_tf32;
#endif

// Warp w of the block (8 warps) owns rows 16·(w % 4) .. +16 of a tile; of a (kTile, kTile)
// score tile the columns 32·(w / 4) .. +32, of a (kTile, HD) accumulator the columns
// HD/2·(w / 4) .. +HD/2. Accumulator element e of 8-column block n sits at row
// mma_row(e), column base + 8·n + mma_col(e).
__device__ __forceinline__ int mma_row(int e) {
  return 16 * (int(threadIdx.x) / 32 % 4) + int(threadIdx.x) % 32 / 4 + 8 * (e / 2);
}
__device__ __forceinline__ int mma_col(int e) { return 2 * (int(threadIdx.x) % 4) + e % 2; }

// dst (kTile, SS) = A · Bᵀ over the head dimension, A and B (kTile, S) tiles.
template <int HD, int S, int SS>
__device__ __forceinline__ void mma_scores(float* dst, const float* A, const float* B) {
  const int warp = int(threadIdx.x) / 32, g = int(threadIdx.x) % 32 / 4, t = int(threadIdx.x) % 4;
  const int r0 = 16 * (warp % 4), c0 = 32 * (warp / 4);
  float acc[4][4];
  for (int n = 0; n < 4; ++n)
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
#pragma unroll 2
  for (int k0 = 0; k0 < HD; k0 += 8) {
    const uint32_t a[4] = {to_tf32(A[(r0 + g) * S + k0 + t]), to_tf32(A[(r0 + g + 8) * S + k0 + t]),
                           to_tf32(A[(r0 + g) * S + k0 + t + 4]),
                           to_tf32(A[(r0 + g + 8) * S + k0 + t + 4])};
    for (int n = 0; n < 4; ++n) {
      const int c = c0 + 8 * n + g;
      const uint32_t b[2] = {to_tf32(B[c * S + k0 + t]), to_tf32(B[c * S + k0 + t + 4])};
      mma_tf32(acc[n], a, b);
    }
  }
  for (int n = 0; n < 4; ++n)
    for (int e = 0; e < 4; ++e) dst[mma_row(e) * SS + c0 + 8 * n + mma_col(e)] = acc[n][e];
}

// acc (this warp's rows and HD/2 columns) += P · X over the first n rows of X: P (kTile,
// SS), X (kTile, S). Columns of P from n on (up to the next multiple of 8) must be
// finite and rows of X there zero, as the kernels leave them.
template <int HD, int S, int SS>
__device__ __forceinline__ void mma_accumulate(float (&acc)[HD / 16][4], const float* P,
                                               const float* X, int n) {
  const int warp = int(threadIdx.x) / 32, g = int(threadIdx.x) % 32 / 4, t = int(threadIdx.x) % 4;
  const int r0 = 16 * (warp % 4), c0 = HD / 2 * (warp / 4);
  for (int k0 = 0; k0 < n; k0 += 8) {
    const uint32_t a[4] = {
        to_tf32(P[(r0 + g) * SS + k0 + t]), to_tf32(P[(r0 + g + 8) * SS + k0 + t]),
        to_tf32(P[(r0 + g) * SS + k0 + t + 4]), to_tf32(P[(r0 + g + 8) * SS + k0 + t + 4])};
    for (int nb = 0; nb < HD / 16; ++nb) {
      const int c = c0 + 8 * nb + g;
      const uint32_t b[2] = {to_tf32(X[(k0 + t) * S + c]), to_tf32(X[(k0 + t + 4) * S + c])};
      mma_tf32(acc[nb], a, b);
    }
  }
}

}  // namespace dhp::cuda::attn
