#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_tuning.h"

// GCC notes (at the end of the file) that passing 32- and 64-byte vectors by value would use
// another ABI without AVX, which cannot matter for these internal, inlined functions.
#pragma GCC diagnostic ignored "-Wpsabi"

// How the work is cut (the arithmetic is in attention_tiles.inc):
// - Tiles of at most kB tokens that never straddle a document boundary (on either side), so
//   packs of short documents give tiles whose pairs are either all visible or all hidden;
//   only tiles on a causal diagonal or inside image blocks test the mask per element, and
//   tile pairs the summaries prove hidden are never visited.
// - Kᵀ (times scale·log2(e), so scores come out in base 2) and, for the backward pass, Vᵀ are
//   packed once per call into per-tile panels of (hdp, kB), every head in one pass over the
//   tokens. q, dout, K and V rows, the output and the gradients are read and written in
//   place at their (T, H, hd) stride when hd is a multiple of 16; other head dims go through
//   copies padded to hdp. Packing every row per head was what cost most on many heads with
//   short documents: a head's slice of a 16-head row is 128 bytes out of 2 KiB, and a short
//   document's tiles carry little arithmetic per byte packed.
// - Forward: one task per (query head, query tile), an online softmax over its visible key
//   tiles in ascending order.
// - Backward recomputes the probabilities once, one query head at a time: one task per key
//   tile computes P, dP and dS for every visible query tile, accumulates dK and dV (continued
//   across the heads of a kv group, in ascending order) and keeps dS·scale; a second pass per
//   query tile sums dS·K over its key tiles in ascending order. Every output row is written by
//   one task in a fixed order, so the result does not depend on the thread count (no
//   atomics, no reduction across threads).
namespace dhp::cpu {
namespace {

constexpr int kB = 64;  // tokens per query and key tile; a (kB, kB) score tile fits in L1
constexpr float kLog2e = 1.44269504f;
constexpr float kLn2 = 0.693147181f;
// The backward pass keeps dS of at most this many floats at once, over all heads (512 KiB, to
// stay in a core's L2 cache from the key pass to the dQ pass), taking the key tiles in batches.
constexpr int64_t kDefaultKeptDsFloats = int64_t(128) << 10;

// Bounds of a tile's mask metadata; two tiles interact only if these allow it.
struct Tile {
  int64_t begin, end;
  int32_t doc_lo, doc_hi, idx_lo, idx_hi, blk_lo, blk_hi;
  bool any_blk;
  bool one_blk;     // every token is in the same bidirectional block
  bool contiguous;  // positions idx_lo, idx_lo + 1, ... in token order
};

std::vector<Tile> make_tiles(AttnMeta m, int64_t T) {
  std::vector<Tile> tiles;
  int64_t i = 0;
  while (i < T) {
    Tile t{i, i, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, false, true,
           true};
    while (t.end < T && t.end - t.begin < kB && m.doc[t.end] == m.doc[t.begin]) {
      const int64_t j = t.end++;
      t.contiguous = t.contiguous && m.idx[j] == m.idx[t.begin] + (j - t.begin);
      t.doc_lo = std::min(t.doc_lo, m.doc[j]);
      t.doc_hi = std::max(t.doc_hi, m.doc[j]);
      t.idx_lo = std::min(t.idx_lo, m.idx[j]);
      t.idx_hi = std::max(t.idx_hi, m.idx[j]);
      if (m.blk[j] >= 0) {
        t.any_blk = true;
        t.blk_lo = std::min(t.blk_lo, m.blk[j]);
        t.blk_hi = std::max(t.blk_hi, m.blk[j]);
      } else {
        t.one_blk = false;
      }
    }
    t.one_blk = t.one_blk && t.blk_lo == t.blk_hi;
    tiles.push_back(t);
    i = t.end;
  }
  return tiles;
}

bool may_see(const Tile& q, const Tile& k) {
  if (q.doc_hi < k.doc_lo || k.doc_hi < q.doc_lo) return false;
  if (k.idx_lo <= q.idx_hi) return true;
  return q.any_blk && k.any_blk && !(q.blk_hi < k.blk_lo || k.blk_hi < q.blk_lo);
}

// Every pair of the two tiles is visible: no per-element mask test needed.
bool sees_all(const Tile& q, const Tile& k) {
  if (!(q.doc_lo == q.doc_hi && k.doc_lo == k.doc_hi && q.doc_lo == k.doc_lo)) return false;
  return k.idx_hi <= q.idx_lo || (q.one_blk && k.one_blk && q.blk_lo == k.blk_lo);
}

// Causal pairs within one document and without image blocks, whose positions run on one by
// one: query row r sees exactly the key columns j <= r + band, band = the query tile's first
// position minus the key tile's. Such a pair (a causal diagonal, most pairs of a pack of short
// documents) is computed as a staircase of 16-row steps instead of a whole tile, skipping the
// products of columns every row of the step masks: about 40% of the arithmetic of a diagonal
// tile.
bool banded(const Tile& q, const Tile& k) {
  return q.doc_lo == q.doc_hi && k.doc_lo == k.doc_hi && q.doc_lo == k.doc_lo && !q.any_blk &&
         !k.any_blk && q.contiguous && k.contiguous;
}

// ---- types shared by the driver and the per-ISA arithmetic ---------------------------------

struct AttnDims {
  int hd, hdp;         // head dim, and padded to a multiple of 16
  float scale;
  int64_t panel;       // floats per packed (hdp, kB) tile of Kᵀ or Vᵀ
};

struct TilePair {
  int64_t i0, j0;  // first query and key token
  int qt, kt;      // tile numbers
  int nj;          // keys in the key tile
  bool all;        // every pair visible
  bool banded;     // not all visible, and row r sees exactly the columns j <= r + band
  int band;
};

struct MaskView {
  const int32_t *qdoc, *qidx, *qblk, *kdoc, *kidx, *kblk;
};

// Rows of a head are read and written in place, at a stride of H·hd floats, when hd is a
// multiple of 16 (every vector then lies inside its head); other head dims go through copies
// padded to hdp with a stride of hdp. Either way a kernel sees a pointer to the tile's first
// row and a row stride.
struct FwdTask {
  const float* q;  // the tile's first query row
  int64_t qs;
  float* o;        // its first output row
  int64_t os;
  float* lse;      // (nr) contiguous
  int nr;
  const TilePair* pairs;
  int n_pairs;
  const float* kt;  // this kv head's packed Kᵀ tiles, times scale·log2(e)
  const float* v;   // this kv head's V row of token 0
  int64_t vs;
};

struct BwdQuery {
  const float* q;     // the query tile's first q row (stride BwdTask::qs)
  const float* dout;  // its first dout row (same stride)
  const float* lse;   // (nr)
  const float* D;     // (nr) rowsum(dout · out)
  float* ds;          // (kB, kB) dS·scale of this tile pair, kept for the dQ pass
  int nr;
};

struct BwdTask {
  const float* kt;  // packed Kᵀ of the key tile, times scale·log2(e)
  const float* vt;  // packed Vᵀ of the key tile
  int nj;
  float* dk;        // the key tile's first dk row
  float* dv;        // and dv row
  int64_t ks;       // their stride
  int64_t qs;       // stride of the q and dout rows
  const TilePair* const* pairs;
  const BwdQuery* queries;
  int n_pairs;
  bool accumulate;  // continue dk and dv (a later query head of the group) instead of writing
};

struct DqTask {
  float* dq;  // the query tile's first dq row
  int64_t qs;
  int nr;
  const TilePair* pairs;
  int n_pairs;
  const float* const* ds;  // (n_pairs) the kept (kB, kB) dS·scale of each pair
  const float* k;          // this kv head's K row of token 0
  int64_t ks;
  bool accumulate;         // continue dq (a later batch of key tiles) instead of writing it
};

// ---- the arithmetic, once per instruction set ----------------------------------------------
// The same source compiled three times under function-level targets (the build passes no
// -march flag, so the default is plain x86-64); attention_isa() picks one at run time. The
// standard headers are included above, outside the target regions, so no library code is
// compiled for a wider ISA than the machine may have.

namespace isa_generic {
constexpr int W = 4, kAcc = 12;  // SSE2: 16 xmm
#define DHP_ATTENTION_LANES 4
#include "kernels/cpu/attention_tiles.inc"
#undef DHP_ATTENTION_LANES
}  // namespace isa_generic

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace isa_avx2 {
constexpr int W = 8, kAcc = 12;  // 16 ymm
#define DHP_ATTENTION_LANES 8
#include "kernels/cpu/attention_tiles.inc"
#undef DHP_ATTENTION_LANES
}  // namespace isa_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")
namespace isa_avx512 {
constexpr int W = 16, kAcc = 24;  // 32 zmm: 6 rows of 4 vectors (hd 64, a 64-key score row)
#define DHP_ATTENTION_LANES 16
#include "kernels/cpu/attention_tiles.inc"
#undef DHP_ATTENTION_LANES
}  // namespace isa_avx512
#pragma GCC pop_options

struct Kernels {
  void (*forward)(const FwdTask&, const AttnDims&, const MaskView&, float*);
  void (*backward_keys)(const BwdTask&, const AttnDims&, const MaskView&, float*);
  void (*backward_queries)(const DqTask&, const AttnDims&);
};

Kernels kernels_for(AttnIsa isa) {
  switch (isa) {
    case AttnIsa::avx512:
      return {isa_avx512::forward_tile, isa_avx512::backward_key_tile,
              isa_avx512::backward_query_tile};
    case AttnIsa::avx2:
      return {isa_avx2::forward_tile, isa_avx2::backward_key_tile, isa_avx2::backward_query_tile};
    default:
      return {isa_generic::forward_tile, isa_generic::backward_key_tile,
              isa_generic::backward_query_tile};
  }
}

AttnIsa g_forced = AttnIsa::best;  // set only by tests and benchmarks (attention_tuning.h)
int64_t g_kept_ds_floats = kDefaultKeptDsFloats;

// ---- the plan of one call: tiles, visible tile pairs, packed K and V ------------------------

struct Plan {
  std::vector<Tile> qt, kt;
  std::vector<TilePair> pairs;   // grouped by query tile, key tiles ascending
  std::vector<int64_t> q_first;  // (nqt + 1) pairs of query tile qt: [q_first[qt], q_first[qt+1])
  std::vector<int64_t> k_first;  // (nkt + 1) into k_pairs
  std::vector<int64_t> k_pairs;  // pair numbers grouped by key tile, query tiles ascending
  AttnDims dims;
};

Plan make_plan(AttnMeta qm, AttnMeta km, const AttnShape& sh) {
  Plan p;
  p.qt = make_tiles(qm, sh.Tq);
  p.kt = make_tiles(km, sh.Tk);
  const int nqt = int(p.qt.size()), nkt = int(p.kt.size());
  p.q_first.assign(size_t(nqt) + 1, 0);
  std::vector<int64_t> k_count(size_t(nkt), 0);
  // Tiles hold one document each, so a query tile can only see the key tiles of its document:
  // find those by binary search instead of testing every pair of tiles (a pack of a thousand
  // one-token documents would otherwise cost a million tests per call).
  std::vector<std::pair<int32_t, int>> by_doc(static_cast<size_t>(nkt));  // (doc, key tile)
  for (int b = 0; b < nkt; ++b) by_doc[size_t(b)] = {p.kt[size_t(b)].doc_lo, b};
  std::sort(by_doc.begin(), by_doc.end());
  for (int a = 0; a < nqt; ++a) {
    const int32_t doc = p.qt[size_t(a)].doc_lo;
    auto it = std::lower_bound(by_doc.begin(), by_doc.end(), std::pair<int32_t, int>{doc, 0});
    for (; it != by_doc.end() && it->first == doc; ++it) {
      const int b = it->second;
      if (!may_see(p.qt[a], p.kt[b])) continue;
      const bool all = sees_all(p.qt[a], p.kt[b]);
      const bool band = !all && banded(p.qt[a], p.kt[b]);
      p.pairs.push_back({p.qt[a].begin, p.kt[b].begin, a, b, int(p.kt[b].end - p.kt[b].begin),
                         all, band, band ? p.qt[a].idx_lo - p.kt[b].idx_lo : 0});
      ++k_count[size_t(b)];
    }
    p.q_first[size_t(a) + 1] = int64_t(p.pairs.size());
  }
  p.k_first.assign(size_t(nkt) + 1, 0);
  for (int b = 0; b < nkt; ++b) p.k_first[size_t(b) + 1] = p.k_first[size_t(b)] + k_count[size_t(b)];
  p.k_pairs.resize(p.pairs.size());
  std::vector<int64_t> fill(p.k_first.begin(), p.k_first.end() - 1);
  for (size_t n = 0; n < p.pairs.size(); ++n) p.k_pairs[size_t(fill[size_t(p.pairs[n].kt)]++)] = int64_t(n);
  const int hdp = (sh.hd + 15) / 16 * 16;
  p.dims = {sh.hd, hdp, sh.scale, int64_t(kB) * hdp};
  return p;
}

// x (T, H, hd), every head, times `scale` -> transposed tiles of (hdp, kB) columns, tile t of
// head h at dst + (h·ntiles + t)·kB·hdp. The keys past the tile's end are zero (the kernels
// read them); rows past hd are never read.
void pack_transposed(std::vector<float>& dst, const float* x, int H, int hd, int hdp,
                     const std::vector<Tile>& tiles, float scale) {
  const int64_t nt = int64_t(tiles.size()), per = int64_t(kB) * hdp;
  dst.resize(size_t(H * nt * per));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t begin = tiles[size_t(t)].begin, n = tiles[size_t(t)].end - begin;
    // Column by column: the tile's rows stay in L1 while every column is written whole.
    for (int h = 0; h < H; ++h) {
      const float* x0 = x + (begin * H + h) * hd;
      float* tile = dst.data() + (h * nt + t) * per;
      for (int c = 0; c < hd; ++c) {
        float* col = tile + c * kB;
        for (int64_t r = 0; r < n; ++r) col[r] = x0[r * H * hd + c] * scale;
        std::fill_n(col + n, kB - n, 0.0f);
      }
    }
  }
}

// Where token i of head h lies: p + h·head + i·row.
struct Rows {
  float* p;
  int64_t head, row;
  float* at(int h, int64_t i) const { return p + h * head + i * row; }
};

// The rows the kernels read of x (T, H, hd): x itself when hd needs no padding and `copy` is
// false, else a copy (H, T, hdp) in buf with zero padding, each head's rows contiguous.
Rows rows_in(std::vector<float>& buf, const float* x, int64_t T, int H, int hd, int hdp,
             bool copy = false) {
  if (hd == hdp && !copy) return {const_cast<float*>(x), hd, int64_t(H) * hd};
  buf.resize(size_t(H * T * hdp));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < T; ++i)
    for (int h = 0; h < H; ++h) {
      float* dst = buf.data() + (h * T + i) * hdp;
      std::copy_n(x + (i * H + h) * hd, hd, dst);
      std::fill_n(dst + hd, hdp - hd, 0.0f);
    }
  return {buf.data(), T * hdp, hdp};
}

// The rows the kernels write of y (T, H, hd): y itself when hd needs no padding, else a
// buffer that rows_out_done copies back.
Rows rows_out(std::vector<float>& buf, float* y, int64_t T, int H, int hd, int hdp) {
  if (hd == hdp) return {y, hd, int64_t(H) * hd};
  buf.resize(size_t(H * T * hdp));
  return {buf.data(), T * hdp, hdp};
}

void rows_out_done(const Rows& r, float* y, int64_t T, int H, int hd) {
  if (r.p == y) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < T; ++i)
    for (int h = 0; h < H; ++h) std::copy_n(r.at(h, i), hd, y + (i * H + h) * hd);
}

// Buffers kept per thread between calls, so the steady state of training neither allocates
// nor page-faults here; they only grow, to the largest shapes seen. The results never depend
// on their previous contents.
struct Workspace {
  std::vector<float> kt, vt, k, v, q, dout, out, dq, dk, dv, D, ds;  // the calling thread's
  std::vector<float> scratch;                          // each worker's
  std::vector<const TilePair*> pairs;
  std::vector<BwdQuery> queries;
  std::vector<const float*> ds_of;
};

Workspace& workspace() {
  thread_local Workspace w;
  return w;
}

MaskView view(AttnMeta qm, AttnMeta km) { return {qm.doc, qm.idx, qm.blk, km.doc, km.idx, km.blk}; }

// Floats of scratch per thread: the larger of a forward task (scores, m, mnew, alpha, l) and a
// backward key-tile task (P and dP).
size_t scratch_floats() {
  const size_t tile = size_t(kB) * kB;
  return std::max(tile + (3 + 16) * size_t(kB), 2 * tile);
}

}  // namespace

AttnIsa attention_isa() {
  static const AttnIsa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
      return AttnIsa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AttnIsa::avx2;
    return AttnIsa::generic;
  }();
  return g_forced == AttnIsa::best || int(g_forced) > int(best) ? best : g_forced;
}

void set_attention_isa(AttnIsa isa) { g_forced = isa; }

int64_t attention_kept_ds_floats() { return g_kept_ds_floats; }
void set_attention_kept_ds_floats(int64_t n) { g_kept_ds_floats = n; }

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       AttnMeta qm, AttnMeta km, const AttnShape& sh) {
  const Plan p = make_plan(qm, km, sh);
  const AttnDims& d = p.dims;
  const Kernels ker = kernels_for(attention_isa());
  Workspace& ws = workspace();
  const int group = sh.Hq / sh.Hkv;
  const int64_t nqt = int64_t(p.qt.size()), nkt = int64_t(p.kt.size());
  const MaskView mv = view(qm, km);
  // Scores come out in base 2 (scale·log2(e) folded into Kᵀ), so the softmax runs on 2^x.
  pack_transposed(ws.kt, k, sh.Hkv, sh.hd, d.hdp, p.kt, sh.scale * kLog2e);
  const Rows qr = rows_in(ws.q, q, sh.Tq, sh.Hq, sh.hd, d.hdp);
  const Rows vr = rows_in(ws.v, v, sh.Tk, sh.Hkv, sh.hd, d.hdp);
  const Rows orow = rows_out(ws.out, out, sh.Tq, sh.Hq, sh.hd, d.hdp);
  const float* kt = ws.kt.data();
#pragma omp parallel
  {
    std::vector<float>& scratch = workspace().scratch;
    scratch.resize(scratch_floats());
    // Query tiles outer, heads inner: consecutive tasks read and write the same rows (the
    // heads of a token are adjacent), so those rows' cache lines and pages are fetched once
    // for all heads. Heads outer went through the whole sequence once per head, which on
    // 16 heads cost a quarter more per head than on 4.
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t a = 0; a < nqt; ++a)
      for (int h = 0; h < sh.Hq; ++h) {
        const Tile& t = p.qt[size_t(a)];
        const int64_t first = p.q_first[size_t(a)];
        const int kvh = h / group;
        const FwdTask task{qr.at(h, t.begin),
                           qr.row,
                           orow.at(h, t.begin),
                           orow.row,
                           lse + int64_t(h) * sh.Tq + t.begin,
                           int(t.end - t.begin),
                           p.pairs.data() + first,
                           int(p.q_first[size_t(a) + 1] - first),
                           kt + kvh * nkt * d.panel,
                           vr.at(kvh, 0),
                           vr.row};
        ker.forward(task, d, mv, scratch.data());
      }
  }
  rows_out_done(orow, out, sh.Tq, sh.Hq, sh.hd);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        AttnMeta qm, AttnMeta km, const AttnShape& sh) {
  const Plan p = make_plan(qm, km, sh);
  const AttnDims& d = p.dims;
  const Kernels ker = kernels_for(attention_isa());
  const int group = sh.Hq / sh.Hkv;
  const int64_t nqt = int64_t(p.qt.size()), nkt = int64_t(p.kt.size());
  const int64_t npairs = int64_t(p.pairs.size()), tile = int64_t(kB) * kB;
  Workspace& ws = workspace();
  const MaskView mv = view(qm, km);

  // Batches of key tiles [batch[n], batch[n+1]) whose pairs' dS, for every head, fit the
  // budget (a key tile with more than that is a batch of its own): on packs of short documents
  // a batch is a document or a few, whose rows of every head and whose kept dS stay in cache
  // from the key pass to the dQ pass. Within a batch, tasks take a tile and every head of it,
  // so consecutive tasks touch the same rows (a token's heads are adjacent in memory); going
  // through the whole sequence once per head read a 128-byte slice of each 2 KiB row of a
  // 16-head model and cost a quarter more per head than on 4 heads. dK and dV of a key tile
  // continue across the heads of a kv group in ascending order; dQ across the batches.
  // slot_of[pair] numbers the pairs by key tile, so a batch's slots are contiguous; the kept
  // dS of a pair and head is at slot·Hq + head.
  const bool copy = npairs >= 8 * std::max(nqt, nkt);
  // Long documents take one kv head at a time (its query heads' dS kept together), the
  // order whose reads of q, dout and K stay within one head's copies; short documents take
  // every head of a batch together.
  const int kv_step = copy ? 1 : sh.Hkv, hq_step = kv_step * group;
  std::vector<int64_t> batch{0};
  int64_t most_slots = 0;
  const int64_t max_slots = std::max<int64_t>(1, g_kept_ds_floats / (tile * hq_step));
  for (int64_t b = 0; b < nkt; ++b) {
    if (b > batch.back() && p.k_first[size_t(b) + 1] - p.k_first[size_t(batch.back())] > max_slots)
      batch.push_back(b);
    most_slots = std::max(most_slots, p.k_first[size_t(b) + 1] - p.k_first[size_t(batch.back())]);
  }
  batch.push_back(nkt);
  std::vector<int64_t> slot_of(static_cast<size_t>(npairs));
  for (int64_t n = 0; n < npairs; ++n) slot_of[size_t(p.k_pairs[size_t(n)])] = n;

  // The same base-2 scores as the forward pass: Kᵀ times scale·log2(e).
  pack_transposed(ws.kt, k, sh.Hkv, sh.hd, d.hdp, p.kt, sh.scale * kLog2e);
  pack_transposed(ws.vt, v, sh.Hkv, sh.hd, d.hdp, p.kt, 1.0f);
  const float *kt = ws.kt.data(), *vt = ws.vt.data();
  // Long documents: a key tile's task reads the q and dout rows of many query tiles, and a
  // query tile's dQ the K rows of many key tiles, so per-head contiguous copies pay for
  // themselves there (the 4096-token document's backward pass ran 10% slower on rows read in
  // place, 1 KiB apart). Short documents read each row a few times and skip the copies.
  const Rows qr = rows_in(ws.q, q, sh.Tq, sh.Hq, sh.hd, d.hdp, copy);
  const Rows dor = rows_in(ws.dout, dout, sh.Tq, sh.Hq, sh.hd, d.hdp, copy);
  const Rows kr = rows_in(ws.k, k, sh.Tk, sh.Hkv, sh.hd, d.hdp, copy);
  const Rows dqr = rows_out(ws.dq, dq, sh.Tq, sh.Hq, sh.hd, d.hdp);
  const Rows dkr = rows_out(ws.dk, dk, sh.Tk, sh.Hkv, sh.hd, d.hdp);
  const Rows dvr = rows_out(ws.dv, dv, sh.Tk, sh.Hkv, sh.hd, d.hdp);
  std::vector<float>& D = ws.D;    // (Hq, Tq) rowsum(dout · out): the softmax term
  std::vector<float>& ds = ws.ds;  // (slots of a batch, kB, kB)
  D.resize(size_t(sh.Hq * sh.Tq));
  ds.resize(size_t(most_slots * hq_step * tile));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < sh.Tq; ++i)
    for (int h = 0; h < sh.Hq; ++h) {
      const float* a = dout + (i * sh.Hq + h) * sh.hd;
      const float* b = out + (i * sh.Hq + h) * sh.hd;
      float s = 0.0f;
      for (int c = 0; c < sh.hd; ++c) s += a[c] * b[c];
      D[size_t(h * sh.Tq + i)] = s;
    }
  for (int kv0 = 0; kv0 < sh.Hkv; kv0 += kv_step)
  for (size_t n = 0; n + 1 < batch.size(); ++n) {
    const int64_t kb0 = batch[n], kb1 = batch[n + 1];
    const int64_t first_slot = p.k_first[size_t(kb0)];
    const int h0 = kv0 * group;
    auto kept = [&](int64_t pair, int h) {
      return ds.data() + ((slot_of[size_t(pair)] - first_slot) * hq_step + (h - h0)) * tile;
    };
#pragma omp parallel
    {
      Workspace& own = workspace();
      std::vector<float>& scratch = own.scratch;
      std::vector<const TilePair*>& pairs = own.pairs;
      std::vector<BwdQuery>& queries = own.queries;
      std::vector<const float*>& ds_of = own.ds_of;
      scratch.resize(scratch_floats());
#pragma omp for collapse(2) schedule(dynamic)
      for (int64_t b = kb0; b < kb1; ++b)
        for (int kvh = kv0; kvh < kv0 + kv_step; ++kvh) {
          const Tile& t = p.kt[size_t(b)];
          const int64_t ktile = (kvh * nkt + b) * d.panel;
          for (int g = 0; g < group; ++g) {
            const int h = kvh * group + g;
            pairs.clear();
            queries.clear();
            for (int64_t m = p.k_first[size_t(b)]; m < p.k_first[size_t(b) + 1]; ++m) {
              const int64_t pi = p.k_pairs[size_t(m)];
              const TilePair& tp = p.pairs[size_t(pi)];
              const Tile& qt = p.qt[size_t(tp.qt)];
              pairs.push_back(&tp);
              queries.push_back({qr.at(h, qt.begin), dor.at(h, qt.begin),
                                 lse + int64_t(h) * sh.Tq + qt.begin,
                                 D.data() + int64_t(h) * sh.Tq + qt.begin, kept(pi, h),
                                 int(qt.end - qt.begin)});
            }
            const BwdTask task{kt + ktile,
                               vt + ktile,
                               int(t.end - t.begin),
                               dkr.at(kvh, t.begin),
                               dvr.at(kvh, t.begin),
                               dkr.row,
                               qr.row,
                               pairs.data(),
                               queries.data(),
                               int(pairs.size()),
                               g > 0};
            ker.backward_keys(task, d, mv, scratch.data());
          }
        }
#pragma omp for collapse(2) schedule(dynamic)
      for (int64_t a = 0; a < nqt; ++a)
        for (int h = h0; h < h0 + hq_step; ++h) {
          // This query tile's pairs with a key tile of the batch: a contiguous run, since
          // its pairs are sorted by key tile.
          int64_t lo = p.q_first[size_t(a)], hi = p.q_first[size_t(a) + 1];
          while (lo < hi && p.pairs[size_t(lo)].kt < kb0) ++lo;
          int64_t end = lo;
          while (end < hi && p.pairs[size_t(end)].kt < kb1) ++end;
          if (n > 0 && end == lo) continue;  // nothing new for it; the first batch wrote it
          ds_of.clear();
          for (int64_t pi = lo; pi < end; ++pi) ds_of.push_back(kept(pi, h));
          const Tile& t = p.qt[size_t(a)];
          const DqTask task{dqr.at(h, t.begin),
                            dqr.row,
                            int(t.end - t.begin),
                            p.pairs.data() + lo,
                            int(end - lo),
                            ds_of.data(),
                            kr.at(h / group, 0),
                            kr.row,
                            n > 0};
          ker.backward_queries(task, d);
        }
    }
  }
  rows_out_done(dqr, dq, sh.Tq, sh.Hq, sh.hd);
  rows_out_done(dkr, dk, sh.Tk, sh.Hkv, sh.hd);
  rows_out_done(dvr, dv, sh.Tk, sh.Hkv, sh.hd);
}

}  // namespace dhp::cpu
