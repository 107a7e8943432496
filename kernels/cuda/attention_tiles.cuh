// The tile shapes of the CUDA attention kernels, and the tile arithmetic that needs no thread
// cooperation: the mask of one (query, key) pair, the bounds of a tile's mask metadata, and
// whether two tiles can share a visible pair. Host and device functions, so tests check them
// on the CPU.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DHP_TILE_FN __host__ __device__ __forceinline__
#else
#define DHP_TILE_FN inline
#endif

namespace dhp::cuda::attn {

constexpr int kTile = 64;                  // tokens per query and key tile
constexpr int kGroup = 16;                 // threads per row (a half-warp), and row groups
constexpr int kThreads = kGroup * kGroup;  // 8 warps
constexpr int kRows = kTile / kGroup;      // rows of a tile per thread: 4·ty + i
constexpr int kCols = kTile / kGroup;      // score columns per thread: tx + 16·j
// Row strides in shared memory, in floats, of tiles of head vectors and of score tiles. The
// fp32 variant pads by one: the 16 rows that a row group reads in one step (tx + 16·j) fall in
// 16 different banks, and so do the two row groups of a warp (rows 4 apart). The tensor-core
// variant pads by four: the 8 rows x 4 columns of an mma fragment fall in 32 different banks.
DHP_TILE_FN constexpr int head_stride(int hd, bool tc) { return tc ? hd + 4 : hd + 1; }
DHP_TILE_FN constexpr int score_stride(bool tc) { return tc ? kTile + 4 : kTile + 1; }
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;

// Query (qd, qi, qb) may see key (kd, ki, kb): the rule of kernels/cpu/attention.h.
DHP_TILE_FN bool sees(int32_t qd, int32_t qi, int32_t qb, int32_t kd, int32_t ki, int32_t kb) {
  return qd == kd && (ki <= qi || (qb >= 0 && qb == kb));
}

// Bounds of the doc, idx and blk of a tile's tokens; blk over the tokens with blk >= 0 only
// (blk_lo > blk_hi when there are none). An empty range (no tokens) has every lo > hi.
struct TileRange {
  int32_t doc_lo, doc_hi, idx_lo, idx_hi, blk_lo, blk_hi;
};

DHP_TILE_FN TileRange range_empty() {
  return {INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN};
}

DHP_TILE_FN TileRange range_of(int32_t doc, int32_t idx, int32_t blk) {
  return {doc, doc, idx, idx, blk >= 0 ? blk : INT32_MAX, blk >= 0 ? blk : INT32_MIN};
}

DHP_TILE_FN int32_t min32(int32_t a, int32_t b) { return a < b ? a : b; }
DHP_TILE_FN int32_t max32(int32_t a, int32_t b) { return a > b ? a : b; }

DHP_TILE_FN TileRange range_merge(const TileRange& a, const TileRange& b) {
  return {min32(a.doc_lo, b.doc_lo), max32(a.doc_hi, b.doc_hi), min32(a.idx_lo, b.idx_lo),
          max32(a.idx_hi, b.idx_hi), min32(a.blk_lo, b.blk_lo), max32(a.blk_hi, b.blk_hi)};
}

// False only if no query of tile q may see any key of tile k, so skipping the pair loses
// nothing: a visible pair needs equal docs (the doc ranges overlap) and either a key idx at
// most a query idx (k.idx_lo <= q.idx_hi) or a shared block (both have blocks whose ranges
// overlap). Tiles may straddle documents; the test is then conservative, never wrong.
DHP_TILE_FN bool may_see(const TileRange& q, const TileRange& k) {
  if (q.doc_hi < k.doc_lo || k.doc_hi < q.doc_lo) return false;
  if (k.idx_lo <= q.idx_hi) return true;
  const bool q_blk = q.blk_lo <= q.blk_hi, k_blk = k.blk_lo <= k.blk_hi;
  return q_blk && k_blk && !(q.blk_hi < k.blk_lo || k.blk_hi < q.blk_lo);
}

}  // namespace dhp::cuda::attn
