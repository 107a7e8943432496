// The bodies of the CUDA attention kernels (flash-attention 2 style), templated on the head
// dimension and on TC: fp32 SIMT products, or tensor-core products on TF32 operands
// (attention_mma.cuh) written to shared memory for the same softmax code. Semantics are those
// of kernels/cpu/attention.h; kernels/cuda/attention.cu has the entry points and
// kernels/cuda/attention_launch.cuh the launches.
//
// Work split: tiles of kTile consecutive tokens on either side (tiles may straddle documents;
// the mask is tested per element). A block of kThreads threads is a 16 x 16 grid: thread
// (ty, tx) owns rows 4·ty .. 4·ty+3 of a tile and the columns tx + 16·j, so the 16 threads of
// a row are one half-warp and row reductions are four shuffles.
// - forward: one block per (query tile, query head); an online softmax over the key tiles in
//   ascending order, in base 2 (scores times scale·log2(e)).
// - backward: one block per (key tile, kv head) accumulates dK and dV over the query heads of
//   the kv group and their query tiles, in ascending order; one block per (query tile, query
//   head) accumulates dQ over the key tiles. Both recompute P from q, k and lse, and
//   D = rowsum(dout·out) per query tile, so nothing needs a workspace and nothing is atomic:
//   results do not depend on scheduling.
// Key tiles a query tile cannot see (attention_tiles.cuh: may_see on the tiles' metadata
// bounds, computed in-kernel by every warp alike) are skipped by the whole block.
//
// The bodies take their shared memory as an argument (the __global__ wrappers declare it), and
// every __syncthreads, shuffle and mma is reached by all threads of the block, so the CPU
// harness of the tests (tests/cuda_emulator.h) can run these bodies with emulated threads.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"

namespace dhp::cuda::attn {

// Head dimensions with a compiled instance; the 16 threads of a row take hd / 16 columns each.
constexpr bool supported_head_dim(int hd) {
  return hd == 16 || hd == 32 || hd == 64 || hd == 80 || hd == 96 || hd == 128;
}

// T: the storage of q, k, v, out and their gradients (kernels/cuda/storage.cuh); lse is fp32.
template <class T>
struct FwdParams {
  T* out;      // (Tq, Hq, hd)
  float* lse;  // (Hq, Tq)
  const T *q, *k, *v;
  AttnMeta qm, km;
  int64_t Tq, Tk;
  int Hq, Hkv;
  float scale;
};

template <class T>
struct BwdParams {
  T *dq, *dk, *dv;
  const T *dout, *out;
  const float* lse;
  const T *q, *k, *v;
  AttnMeta qm, km;
  int64_t Tq, Tk;
  int Hq, Hkv;
  float scale;
};

// Shared memory per block, in floats (the mask metadata is int32, the same size); strides in
// attention_tiles.cuh.
__host__ __device__ constexpr int tile_floats(int hd, bool tc) {
  return kTile * head_stride(hd, tc);
}
// The forward kernel of bf16 storage double-buffers its key and value tiles: the next visible
// tile's raw rows are in flight (cp.async) while the current one computes. Whether a variant
// does, and the floats of its staging: two buffers of a key and a value tile, elem_bytes each.
__host__ __device__ constexpr bool forward_staged(bool tc, int elem_bytes) {
  return tc && elem_bytes == 2;
}
__host__ __device__ constexpr int forward_stage_floats(int hd, bool tc, int elem_bytes) {
  return forward_staged(tc, elem_bytes) ? 2 * 2 * kTile * hd * elem_bytes / 4 : 0;
}
__host__ __device__ constexpr int forward_smem_floats(int hd, bool tc, int elem_bytes) {
  return 2 * tile_floats(hd, tc) + kTile * score_stride(tc) + 8 * kTile +
         forward_stage_floats(hd, tc, elem_bytes);
}
// In bf16 storage the dK/dV kernel stages the next visible query and dout tiles (one buffer of
// each, raw) while the current pair computes: 204 KiB in all at hd 128.
__host__ __device__ constexpr int backward_kv_smem_floats(int hd, bool tc, int elem_bytes) {
  return 4 * tile_floats(hd, tc) + 2 * kTile * score_stride(tc) + 8 * kTile +
         (forward_staged(tc, elem_bytes) ? 2 * kTile * hd * elem_bytes / 4 : 0);
}
// The TF32 variant keeps dP in shared memory besides dS. In bf16 storage the dQ kernel stages
// the next visible key and value tiles (one buffer of each, raw: 32 KiB at hd 128, 204 KiB in
// all) while the current pair computes from the fp32 tiles.
__host__ __device__ constexpr int backward_q_stage_floats(int hd, bool tc, int elem_bytes) {
  return forward_staged(tc, elem_bytes) ? 2 * kTile * hd * elem_bytes / 4 : 0;
}
__host__ __device__ constexpr int backward_q_smem_floats(int hd, bool tc, int elem_bytes) {
  return 4 * tile_floats(hd, tc) + (tc ? 2 : 1) * kTile * score_stride(tc) + 8 * kTile +
         backward_q_stage_floats(hd, tc, elem_bytes);
}

__device__ __forceinline__ float group_max(float x) {
  for (int o = kGroup / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o, kGroup));
  return x;
}

__device__ __forceinline__ float group_sum(float x) {
  for (int o = kGroup / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o, kGroup);
  return x;
}

// The metadata bounds of tokens t0 .. t0+n, the same in every lane of every warp.
__device__ __forceinline__ TileRange warp_range(const AttnMeta& m, int64_t t0, int n) {
  TileRange r = range_empty();
  for (int i = int(threadIdx.x % 32); i < n; i += 32)
    r = range_merge(r, range_of(m.doc[t0 + i], m.idx[t0 + i], m.blk[t0 + i]));
  for (int o = 16; o > 0; o /= 2) {
    TileRange x;
    x.doc_lo = __shfl_xor_sync(0xffffffffu, r.doc_lo, o);
    x.doc_hi = __shfl_xor_sync(0xffffffffu, r.doc_hi, o);
    x.idx_lo = __shfl_xor_sync(0xffffffffu, r.idx_lo, o);
    x.idx_hi = __shfl_xor_sync(0xffffffffu, r.idx_hi, o);
    x.blk_lo = __shfl_xor_sync(0xffffffffu, r.blk_lo, o);
    x.blk_hi = __shfl_xor_sync(0xffffffffu, r.blk_hi, o);
    r = range_merge(r, x);
  }
  return r;
}

// Rows t0 .. t0+n of head h of x (T, H, HD) into dst (kTile, S); rows from n on are 0.
template <int HD, int S, class T>
__device__ __forceinline__ void load_tile(float* dst, const T* x, int64_t t0, int n, int H,
                                          int h) {
  for (int e = int(threadIdx.x); e < kTile * HD; e += kThreads) {
    const int r = e / HD, c = e % HD;
    dst[r * S + c] = r < n ? ld(x[((t0 + r) * H + h) * HD + c]) : 0.0f;
  }
}

// doc, idx, blk of tokens t0 .. t0+n into dst (3, kTile); entries from n on are never used
// (every mask test checks the row and column against the tile's size first).
__device__ __forceinline__ void load_meta(int32_t* dst, const AttnMeta& m, int64_t t0, int n) {
  for (int i = int(threadIdx.x); i < kTile; i += kThreads) {
    const bool in = i < n;
    dst[i] = in ? m.doc[t0 + i] : 0;
    dst[kTile + i] = in ? m.idx[t0 + i] : 0;
    dst[2 * kTile + i] = in ? m.blk[t0 + i] : -1;
  }
}

__device__ __forceinline__ bool sees_meta(const int32_t* qmeta, int r, const int32_t* kmeta,
                                          int c) {
  return sees(qmeta[r], qmeta[kTile + r], qmeta[2 * kTile + r], kmeta[c], kmeta[kTile + c],
              kmeta[2 * kTile + c]);
}

// D = rowsum(dout · out) of the query tile, dout from shared memory (dos), out from global:
// four threads per row.
template <int HD, int S, class T>
__device__ __forceinline__ void row_dots(float* dd, const float* dos, const T* out, int64_t q0,
                                         int nq, int H, int h) {
  static_assert(kThreads == 4 * kTile, "four threads per row");
  const int r = int(threadIdx.x) / 4, part = int(threadIdx.x) % 4;
  float acc = 0.0f;
  if (r < nq)
    for (int c = part; c < HD; c += 4) acc += dos[r * S + c] * ld(out[((q0 + r) * H + h) * HD + c]);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1, 4);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2, 4);
  if (part == 0) dd[r] = acc;
}

__device__ __forceinline__ int tile_size(int64_t T, int64_t t0) {
  return T - t0 < kTile ? int(T - t0) : kTile;
}

// Writes a tile's n rows of an accumulator — in the thread grid's layout (acc: rows 4·ty + i,
// columns tx + 16·v) or the tensor cores' (accc) — to rows t0.. of x (T, H, HD) at head h,
// times scale(r) for row r, rounded once to x's storage.
template <int HD, bool TC, class T, class Scale>
__device__ __forceinline__ void store_tile(T* x, int64_t t0, int n, int H, int h,
                                           const float (&acc)[kRows][HD / kGroup],
                                           const float (&accc)[HD / kGroup][4], Scale scale) {
  constexpr int NV = HD / kGroup;
  if constexpr (TC) {
    const int c0 = HD / 2 * (int(threadIdx.x) / 32 / 4);
    for (int e = 0; e < 4; ++e) {
      const int r = mma_row(e);
      if (r >= n) continue;
      const float f = scale(r);
      T* row = x + ((t0 + r) * H + h) * HD + c0;
      for (int v = 0; v < NV; ++v) row[8 * v + mma_col(e)] = st<T>(accc[v][e] * f);
    }
  } else {
    const int ty = int(threadIdx.x) / kGroup, tx = int(threadIdx.x) % kGroup;
    for (int i = 0; i < kRows; ++i) {
      const int r = ty * kRows + i;
      if (r >= n) continue;
      const float f = scale(r);
      T* row = x + ((t0 + r) * H + h) * HD;
      for (int v = 0; v < NV; ++v) row[tx + kGroup * v] = st<T>(acc[i][v] * f);
    }
  }
}

// The scale of a gradient's rows.
struct Unscaled {
  __device__ __forceinline__ float operator()(int) const { return 1.0f; }
};

// The backward kernels' two products of a tile pair in this thread's slice (rows 4·ty + i of
// a1/a2, columns tx + 16·j of b1/b2): x1 = a1·b1ᵀ and x2 = a2·b2ᵀ over HD. The tensor-core
// variant has them already in m1/m2 (row stride SS); the fp32 one sums them here, both in
// one pass over the head dimension.
template <int HD, int S, int SS, bool TC>
__device__ __forceinline__ void slice_product_pair(float (&x1)[kRows][kCols],
                                                   float (&x2)[kRows][kCols], const float* a1,
                                                   const float* b1, const float* m1,
                                                   const float* a2, const float* b2,
                                                   const float* m2, int tx, int ty) {
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kCols; ++j) {
      const int at = (ty * kRows + i) * SS + tx + kGroup * j;
      x1[i][j] = TC ? m1[at] : 0.0f;
      x2[i][j] = TC ? m2[at] : 0.0f;
    }
#pragma unroll 4
  for (int d = 0; d < (TC ? 0 : HD); ++d) {
    float r1[kRows], r2[kRows], c1[kCols], c2[kCols];
    for (int i = 0; i < kRows; ++i) {
      r1[i] = a1[(ty * kRows + i) * S + d];
      r2[i] = a2[(ty * kRows + i) * S + d];
    }
    for (int j = 0; j < kCols; ++j) {
      c1[j] = b1[(tx + kGroup * j) * S + d];
      c2[j] = b2[(tx + kGroup * j) * S + d];
    }
    for (int i = 0; i < kRows; ++i)
      for (int j = 0; j < kCols; ++j) {
        x1[i][j] += r1[i] * c1[j];
        x2[i][j] += r2[i] * c2[j];
      }
  }
}

// ---- forward: one (query tile, query head) per block ----------------------------------------

// Starts copying rows t0 .. t0+n of head h of x (T, H, HD) into dst (kTile, HD), raw: 16-byte
// pieces in flight when x is 16-byte aligned (row strides are: HD·sizeof(T) is a multiple of
// 16 for every instantiated head dimension), plain loads otherwise. Rows from n on are left
// as they are; unstage_tile never reads them.
template <int HD, class T>
__device__ __forceinline__ void stage_tile(T* dst, const T* x, int64_t t0, int n, int H, int h) {
  static_assert(HD * sizeof(T) % 16 == 0, "rows of whole 16-byte pieces");
  constexpr int kPieces = int(HD * sizeof(T) / 16), kPer = int(16 / sizeof(T));
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    for (int e = int(threadIdx.x); e < n * kPieces; e += kThreads) {
      const int r = e / kPieces, c = (e % kPieces) * kPer;
      copy16_async(dst + r * HD + c, x + ((t0 + r) * H + h) * HD + c);
    }
  } else {
    for (int e = int(threadIdx.x); e < n * HD; e += kThreads) {
      const int r = e / HD, c = e % HD;
      dst[r * HD + c] = x[((t0 + r) * H + h) * HD + c];
    }
  }
}

// A staged tile (kTile, HD) into dst (kTile, S) as fp32; rows from n on are 0.
template <int HD, int S, class T>
__device__ __forceinline__ void unstage_tile(float* dst, const T* src, int n) {
  for (int e = int(threadIdx.x); e < kTile * HD; e += kThreads) {
    const int r = e / HD, c = e % HD;
    dst[r * S + c] = r < n ? ld(src[r * HD + c]) : 0.0f;
  }
}

// Starts the raw copies of rows t0 .. t0+n of head h of x and of y into stage (2, kTile, HD),
// as one group.
template <int HD, class T>
__device__ __forceinline__ void stage_pair(T* stage, const T* x, const T* y, int64_t t0, int n,
                                           int H, int h) {
  stage_tile<HD>(stage, x, t0, n, H, h);
  stage_tile<HD>(stage + kTile * HD, y, t0, n, H, h);
  async_commit();
}

// The fp32 tiles a and b (kTile, S) of rows t0 .. t0+n of head h of x and of y: widened from
// the staging buffer where the kernel stages, else loaded.
template <int HD, int S, bool Staged, class T>
__device__ __forceinline__ void take_pair(float* a, float* b, const T* stage, const T* x,
                                          const T* y, int64_t t0, int n, int H, int h) {
  if constexpr (Staged) {
    unstage_tile<HD, S>(a, stage, n);
    unstage_tile<HD, S>(b, stage + kTile * HD, n);
  } else {
    load_tile<HD, S>(a, x, t0, n, H, h);
    load_tile<HD, S>(b, y, t0, n, H, h);
  }
}

// The first key tile from kt on that the query tile (metadata bounds qr) may see, or nkt.
// Reached by every thread alike (warp_range shuffles). P: FwdParams or BwdParams.
template <class P>
__device__ __forceinline__ int64_t next_visible(const P& p, const TileRange& qr, int64_t kt,
                                                int64_t nkt) {
  for (; kt < nkt; ++kt) {
    const int64_t k0 = kt * kTile;
    if (may_see(qr, warp_range(p.km, k0, tile_size(p.Tk, k0)))) break;
  }
  return kt;
}

// TC: the products on tensor cores (attention_mma.cuh), the softmax as in the fp32 variant.
template <int HD, bool TC, class T>
__device__ void forward_block(const FwdParams<T>& p, float* smem) {
  constexpr int S = head_stride(HD, TC), SS = score_stride(TC), NV = HD / kGroup;
  float* qs = smem;                      // (kTile, S) queries
  float* kv = qs + tile_floats(HD, TC);  // (kTile, S) keys, then values
  float* ps = kv + tile_floats(HD, TC);  // (kTile, SS) scores, then probabilities
  float* row_alpha = ps + kTile * SS;    // (kTile) TC: the rescaling of each row
  float* row_sum = row_alpha + kTile;    // (kTile) the final row sums
  int32_t* qmeta = reinterpret_cast<int32_t*>(row_sum + kTile);  // (3, kTile)
  int32_t* kmeta = qmeta + 3 * kTile;                            // (3, kTile)
  constexpr bool kStaged = forward_staged(TC, int(sizeof(T)));
  constexpr int kStageElems = kTile * HD;
  // (2, 2, kTile, HD): per buffer a key tile then a value tile, raw storage
  [[maybe_unused]] T* stage = reinterpret_cast<T*>(kmeta + 3 * kTile);
  const int ty = int(threadIdx.x) / kGroup, tx = int(threadIdx.x) % kGroup;
  // Reversed so that the last query tiles, which see the most keys under a causal mask, start
  // first.
  const int64_t qt = int64_t(gridDim.x) - 1 - blockIdx.x;
  const int h = int(blockIdx.y), hk = h / (p.Hq / p.Hkv);
  const int64_t q0 = qt * kTile;
  const int nq = tile_size(p.Tq, q0);
  const float scale2 = p.scale * kLog2e;

  load_tile<HD, S>(qs, p.q, q0, nq, p.Hq, h);
  load_meta(qmeta, p.qm, q0, nq);
  const TileRange qr = warp_range(p.qm, q0, nq);

  // Running maximum (base 2) and this thread's part of the row sums of 2^(s - m); the output
  // accumulators in the thread grid's layout (o) or the tensor cores' (oc).
  float o[kRows][NV], oc[NV][4], m[kRows], l[kRows];
  for (int i = 0; i < kRows; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    for (int v = 0; v < NV; ++v) o[i][v] = 0.0f;
  }
  for (int v = 0; v < NV; ++v)
    for (int e = 0; e < 4; ++e) oc[v][e] = 0.0f;
  const int64_t nkt = (p.Tk + kTile - 1) / kTile;
  // Staged: the visible tile after the current one is copied into the other buffer while the
  // current one computes.
  [[maybe_unused]] auto stage_next = [&](int buf, int64_t kt) {
    const int64_t k0 = kt * kTile;
    stage_pair<HD>(stage + 2 * buf * kStageElems, p.k, p.v, k0, tile_size(p.Tk, k0), p.Hkv, hk);
  };
  int64_t kt = next_visible(p, qr, 0, nkt);
  if constexpr (kStaged)
    if (kt < nkt) stage_next(0, kt);
  for (int buf = 0; kt < nkt; buf ^= 1) {
    const int64_t k0 = kt * kTile, next = next_visible(p, qr, kt + 1, nkt);
    const int nk = tile_size(p.Tk, k0);
    if constexpr (kStaged) {
      // The other buffer was last read before the previous tile's final barrier.
      if (next < nkt) {
        stage_next(buf ^ 1, next);
        async_wait<1>();
      } else {
        async_wait<0>();
      }
    }
    __syncthreads();  // the previous tile's reads of kv, ps and row_alpha are done
    if constexpr (kStaged)
      unstage_tile<HD, S>(kv, stage + 2 * buf * kStageElems, nk);
    else
      load_tile<HD, S>(kv, p.k, k0, nk, p.Hkv, hk);
    load_meta(kmeta, p.km, k0, nk);
    __syncthreads();
    float s[kRows][kCols];
    if constexpr (TC) {
      mma_scores<HD, S, SS>(ps, qs, kv);
      __syncthreads();
      for (int i = 0; i < kRows; ++i)
        for (int j = 0; j < kCols; ++j) s[i][j] = ps[(ty * kRows + i) * SS + tx + kGroup * j];
    } else {
      for (int i = 0; i < kRows; ++i)
        for (int j = 0; j < kCols; ++j) s[i][j] = 0.0f;
#pragma unroll 8
      for (int d = 0; d < HD; ++d) {
        float a[kRows], b[kCols];
        for (int i = 0; i < kRows; ++i) a[i] = qs[(ty * kRows + i) * S + d];
        for (int j = 0; j < kCols; ++j) b[j] = kv[(tx + kGroup * j) * S + d];
        for (int i = 0; i < kRows; ++i)
          for (int j = 0; j < kCols; ++j) s[i][j] += a[i] * b[j];
      }
    }
    for (int i = 0; i < kRows; ++i) {
      const int r = ty * kRows + i;
      float mx = -INFINITY;
      for (int j = 0; j < kCols; ++j) {
        const int c = tx + kGroup * j;
        const bool vis = r < nq && c < nk && sees_meta(qmeta, r, kmeta, c);
        s[i][j] = vis ? s[i][j] * scale2 : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float mn = fmaxf(m[i], group_max(mx));
      // A row that has seen nothing yet keeps m = -inf, p = 0 and its zero accumulators.
      const float alpha = mn == -INFINITY ? 1.0f : exp2f(m[i] - mn);
      float sum = 0.0f;
      for (int j = 0; j < kCols; ++j) {
        s[i][j] = mn == -INFINITY ? 0.0f : exp2f(s[i][j] - mn);
        sum += s[i][j];
      }
      l[i] = l[i] * alpha + sum;
      m[i] = mn;
      if constexpr (TC) {
        if (tx == 0) row_alpha[r] = alpha;
      } else {
        for (int v = 0; v < NV; ++v) o[i][v] *= alpha;
      }
    }
    __syncthreads();  // every thread is done reading the keys (and, TC, the scores)
    for (int i = 0; i < kRows; ++i)
      for (int j = 0; j < kCols; ++j) ps[(ty * kRows + i) * SS + tx + kGroup * j] = s[i][j];
    if constexpr (kStaged)
      unstage_tile<HD, S>(kv, stage + (2 * buf + 1) * kStageElems, nk);
    else
      load_tile<HD, S>(kv, p.v, k0, nk, p.Hkv, hk);
    __syncthreads();
    if constexpr (TC) {
      for (int v = 0; v < NV; ++v)
        for (int e = 0; e < 4; ++e) oc[v][e] *= row_alpha[mma_row(e)];
      mma_accumulate<HD, S, SS>(oc, ps, kv, nk);
    } else {
#pragma unroll 4
      for (int c = 0; c < nk; ++c) {
        float b[NV];
        for (int v = 0; v < NV; ++v) b[v] = kv[c * S + tx + kGroup * v];
        for (int i = 0; i < kRows; ++i) {
          const float pc = ps[(ty * kRows + i) * SS + c];
          for (int v = 0; v < NV; ++v) o[i][v] += pc * b[v];
        }
      }
    }
    kt = next;
  }
  for (int i = 0; i < kRows; ++i) {
    const int r = ty * kRows + i;
    const float lt = group_sum(l[i]);
    if (r >= nq) continue;
    if (tx == 0) {
      p.lse[int64_t(h) * p.Tq + q0 + r] = lt > 0.0f ? (m[i] + log2f(lt)) * kLn2 : -INFINITY;
      row_sum[r] = lt;
    }
  }
  __syncthreads();  // every row's sum is in row_sum (the tensor-core layout spans row groups)
  store_tile<HD, TC>(p.out, q0, nq, p.Hq, h, o, oc,
                     [&](int r) { return row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f; });
}

// ---- backward, dK and dV: one (key tile, kv head) per block ---------------------------------

template <int HD, bool TC, class T>
__device__ void backward_kv_block(const BwdParams<T>& p, float* smem) {
  constexpr int S = head_stride(HD, TC), SS = score_stride(TC), NV = HD / kGroup;
  float* ks = smem;                       // (kTile, S) keys
  float* vs = ks + tile_floats(HD, TC);   // (kTile, S) values
  float* qs = vs + tile_floats(HD, TC);   // (kTile, S) queries
  float* dos = qs + tile_floats(HD, TC);  // (kTile, S) dout
  float* pt = dos + tile_floats(HD, TC);  // (kTile keys, SS) P transposed
  float* dst = pt + kTile * SS;           // (kTile keys, SS) dS·scale transposed
  float* lse2 = dst + kTile * SS;         // (kTile) lse·log2(e) of the query tile
  float* dd = lse2 + kTile;               // (kTile) D of the query tile
  int32_t* kmeta = reinterpret_cast<int32_t*>(dd + kTile);  // (3, kTile)
  int32_t* qmeta = kmeta + 3 * kTile;                       // (3, kTile)
  constexpr bool kStaged = forward_staged(TC, int(sizeof(T)));
  // (2, kTile, HD): the next query tile then its dout tile, raw storage
  [[maybe_unused]] T* stage = reinterpret_cast<T*>(qmeta + 3 * kTile);
  const int ty = int(threadIdx.x) / kGroup, tx = int(threadIdx.x) % kGroup;
  const int64_t k0 = int64_t(blockIdx.x) * kTile;
  const int hk = int(blockIdx.y), group = p.Hq / p.Hkv;
  const int nk = tile_size(p.Tk, k0);
  const float scale2 = p.scale * kLog2e;

  load_tile<HD, S>(ks, p.k, k0, nk, p.Hkv, hk);
  load_tile<HD, S>(vs, p.v, k0, nk, p.Hkv, hk);
  load_meta(kmeta, p.km, k0, nk);
  const TileRange kr = warp_range(p.km, k0, nk);

  // The thread grid's layout (dk, dv) or the tensor cores' (dkc, dvc).
  float dk[kRows][NV], dv[kRows][NV], dkc[NV][4], dvc[NV][4];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < NV; ++v) dk[i][v] = dv[i][v] = 0.0f;
  for (int v = 0; v < NV; ++v)
    for (int e = 0; e < 4; ++e) dkc[v][e] = dvc[v][e] = 0.0f;
  // The (query head of the group, query tile) pairs in order, flattened as g·nqt + qt; the
  // first visible one from i on (visibility does not depend on the head), or n.
  const int64_t nqt = (p.Tq + kTile - 1) / kTile, n = int64_t(group) * nqt;
  auto next_pair = [&](int64_t i) {
    for (; i < n; ++i) {
      const int64_t q0 = (i % nqt) * kTile;
      if (may_see(warp_range(p.qm, q0, tile_size(p.Tq, q0)), kr)) break;
    }
    return i;
  };
  [[maybe_unused]] auto stage_next = [&](int64_t i) {
    const int64_t q0 = (i % nqt) * kTile;
    stage_pair<HD>(stage, p.q, p.dout, q0, tile_size(p.Tq, q0), p.Hq, hk * group + int(i / nqt));
  };
  int64_t i_pair = next_pair(0);
  if constexpr (kStaged)
    if (i_pair < n) stage_next(i_pair);
  while (i_pair < n) {
    {
      const int h = hk * group + int(i_pair / nqt);
      const int64_t q0 = (i_pair % nqt) * kTile, next = next_pair(i_pair + 1);
      const int nq = tile_size(p.Tq, q0);
      if constexpr (kStaged) async_wait<0>();
      __syncthreads();  // the previous tile's reads of qs, dos, pt, dst, lse2, dd are done
      take_pair<HD, S, kStaged>(qs, dos, stage, p.q, p.dout, q0, nq, p.Hq, h);
      load_meta(qmeta, p.qm, q0, nq);
      for (int i = int(threadIdx.x); i < kTile; i += kThreads)
        lse2[i] = i < nq ? p.lse[int64_t(h) * p.Tq + q0 + i] * kLog2e : -INFINITY;
      __syncthreads();
      // The staging buffer is read: the next visible pair flies in while this one computes.
      if constexpr (kStaged)
        if (next < n) stage_next(next);
      i_pair = next;
      row_dots<HD, S>(dd, dos, p.out, q0, nq, p.Hq, h);
      if constexpr (TC) {
        mma_scores<HD, S, SS>(pt, ks, qs);
        mma_scores<HD, S, SS>(dst, vs, dos);
      }
      __syncthreads();
      // Transposed products: rows are keys (4·ty + i), columns queries (tx + 16·j).
      float st[kRows][kCols], dpt[kRows][kCols];
      slice_product_pair<HD, S, SS, TC>(st, dpt, ks, qs, pt, vs, dos, dst, tx, ty);
      for (int i = 0; i < kRows; ++i)
        for (int j = 0; j < kCols; ++j) {
          const int r = ty * kRows + i, c = tx + kGroup * j;
          const float L = lse2[c];
          // lse = -inf: the query saw no key in the forward pass (nor will it here).
          const bool vis = r < nk && c < nq && L != -INFINITY && sees_meta(qmeta, c, kmeta, r);
          const float pv = vis ? exp2f(st[i][j] * scale2 - L) : 0.0f;
          pt[r * SS + c] = pv;
          dst[r * SS + c] = pv * (dpt[i][j] - dd[c]) * p.scale;
        }
      __syncthreads();
      if constexpr (TC) {
        mma_accumulate<HD, S, SS>(dvc, pt, dos, nq);
        mma_accumulate<HD, S, SS>(dkc, dst, qs, nq);
      }
#pragma unroll 4
      for (int c = 0; c < (TC ? 0 : nq); ++c) {
        float bo[NV], bq[NV];
        for (int v = 0; v < NV; ++v) {
          bo[v] = dos[c * S + tx + kGroup * v];
          bq[v] = qs[c * S + tx + kGroup * v];
        }
        for (int i = 0; i < kRows; ++i) {
          const float pp = pt[(ty * kRows + i) * SS + c];
          const float ds = dst[(ty * kRows + i) * SS + c];
          for (int v = 0; v < NV; ++v) {
            dv[i][v] += pp * bo[v];
            dk[i][v] += ds * bq[v];
          }
        }
      }
    }
  }
  store_tile<HD, TC>(p.dk, k0, nk, p.Hkv, hk, dk, dkc, Unscaled{});
  store_tile<HD, TC>(p.dv, k0, nk, p.Hkv, hk, dv, dvc, Unscaled{});
}

// ---- backward, dQ: one (query tile, query head) per block -----------------------------------

template <int HD, bool TC, class T>
__device__ void backward_q_block(const BwdParams<T>& p, float* smem) {
  constexpr int S = head_stride(HD, TC), SS = score_stride(TC), NV = HD / kGroup;
  float* qs = smem;                                          // (kTile, S) queries
  float* dos = qs + tile_floats(HD, TC);                     // (kTile, S) dout
  float* ks = dos + tile_floats(HD, TC);                     // (kTile, S) keys
  float* vs = ks + tile_floats(HD, TC);                      // (kTile, S) values
  float* dss = vs + tile_floats(HD, TC);                     // (kTile, SS) dS·scale
  float* lse2 = dss + kTile * SS;                            // (kTile)
  float* dd = lse2 + kTile;                                  // (kTile)
  int32_t* qmeta = reinterpret_cast<int32_t*>(dd + kTile);   // (3, kTile)
  int32_t* kmeta = qmeta + 3 * kTile;                        // (3, kTile)
  float* dpb = reinterpret_cast<float*>(kmeta + 3 * kTile);  // (kTile, SS) TC: dP
  constexpr bool kStaged = forward_staged(TC, int(sizeof(T)));
  // (2, kTile, HD): the next key tile then its value tile, raw storage
  [[maybe_unused]] T* stage = reinterpret_cast<T*>(dpb + (TC ? kTile * SS : 0));
  const int ty = int(threadIdx.x) / kGroup, tx = int(threadIdx.x) % kGroup;
  const int64_t qt = int64_t(gridDim.x) - 1 - blockIdx.x;  // the busiest causal tiles first
  const int h = int(blockIdx.y), hk = h / (p.Hq / p.Hkv);
  const int64_t q0 = qt * kTile;
  const int nq = tile_size(p.Tq, q0);
  const float scale2 = p.scale * kLog2e;

  load_tile<HD, S>(qs, p.q, q0, nq, p.Hq, h);
  load_tile<HD, S>(dos, p.dout, q0, nq, p.Hq, h);
  load_meta(qmeta, p.qm, q0, nq);
  for (int i = int(threadIdx.x); i < kTile; i += kThreads)
    lse2[i] = i < nq ? p.lse[int64_t(h) * p.Tq + q0 + i] * kLog2e : -INFINITY;
  __syncthreads();
  row_dots<HD, S>(dd, dos, p.out, q0, nq, p.Hq, h);
  const TileRange qr = warp_range(p.qm, q0, nq);

  // The thread grid's layout (dq) or the tensor cores' (dqc).
  float dq[kRows][NV], dqc[NV][4];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < NV; ++v) dq[i][v] = 0.0f;
  for (int v = 0; v < NV; ++v)
    for (int e = 0; e < 4; ++e) dqc[v][e] = 0.0f;
  const int64_t nkt = (p.Tk + kTile - 1) / kTile;
  [[maybe_unused]] auto stage_next = [&](int64_t kt) {
    stage_pair<HD>(stage, p.k, p.v, kt * kTile, tile_size(p.Tk, kt * kTile), p.Hkv, hk);
  };
  int64_t kt = next_visible(p, qr, 0, nkt);
  if constexpr (kStaged)
    if (kt < nkt) stage_next(kt);
  for (; kt < nkt;) {
    const int64_t k0 = kt * kTile, next = next_visible(p, qr, kt + 1, nkt);
    const int nk = tile_size(p.Tk, k0);
    if constexpr (kStaged) async_wait<0>();
    __syncthreads();  // dd is written; the previous tile's reads of ks, vs, dss are done
    take_pair<HD, S, kStaged>(ks, vs, stage, p.k, p.v, k0, nk, p.Hkv, hk);
    load_meta(kmeta, p.km, k0, nk);
    __syncthreads();
    // The staging buffer is read: the next visible pair flies in while this one computes.
    if constexpr (kStaged)
      if (next < nkt) stage_next(next);
    if constexpr (TC) {
      mma_scores<HD, S, SS>(dss, qs, ks);
      mma_scores<HD, S, SS>(dpb, dos, vs);
      __syncthreads();
    }
    float s[kRows][kCols], dp[kRows][kCols];
    slice_product_pair<HD, S, SS, TC>(s, dp, qs, ks, dss, dos, vs, dpb, tx, ty);
    for (int i = 0; i < kRows; ++i) {
      const int r = ty * kRows + i;
      const float L = lse2[r], D = dd[r];
      for (int j = 0; j < kCols; ++j) {
        const int c = tx + kGroup * j;
        const bool vis = r < nq && c < nk && L != -INFINITY && sees_meta(qmeta, r, kmeta, c);
        const float pv = vis ? exp2f(s[i][j] * scale2 - L) : 0.0f;
        dss[r * SS + c] = pv * (dp[i][j] - D) * p.scale;
      }
    }
    __syncthreads();
    if constexpr (TC) mma_accumulate<HD, S, SS>(dqc, dss, ks, nk);
#pragma unroll 4
    for (int c = 0; c < (TC ? 0 : nk); ++c) {
      float b[NV];
      for (int v = 0; v < NV; ++v) b[v] = ks[c * S + tx + kGroup * v];
      for (int i = 0; i < kRows; ++i) {
        const float ds = dss[(ty * kRows + i) * SS + c];
        for (int v = 0; v < NV; ++v) dq[i][v] += ds * b[v];
      }
    }
    kt = next;
  }
  store_tile<HD, TC>(p.dq, q0, nq, p.Hq, h, dq, dqc, Unscaled{});
}

}  // namespace dhp::cuda::attn
