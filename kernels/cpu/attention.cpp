#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace dhp::cpu {
namespace {

constexpr int64_t kBq = 32;  // query rows per tile
constexpr int64_t kBk = 64;  // key rows per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Bounds of a tile's mask metadata; two tiles interact only if these allow it.
struct Tile {
  int32_t doc_lo, doc_hi, idx_lo, idx_hi, blk_lo, blk_hi;
  bool any_blk;
  bool one_blk;  // every token is in the same bidirectional block
};

std::vector<Tile> summarise(AttnMeta m, int64_t T, int64_t B) {
  std::vector<Tile> tiles((T + B - 1) / B);
  for (size_t b = 0; b < tiles.size(); ++b) {
    Tile t{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, false, true};
    for (int64_t i = b * B; i < std::min<int64_t>(T, (b + 1) * B); ++i) {
      t.doc_lo = std::min(t.doc_lo, m.doc[i]);
      t.doc_hi = std::max(t.doc_hi, m.doc[i]);
      t.idx_lo = std::min(t.idx_lo, m.idx[i]);
      t.idx_hi = std::max(t.idx_hi, m.idx[i]);
      if (m.blk[i] >= 0) {
        t.any_blk = true;
        t.blk_lo = std::min(t.blk_lo, m.blk[i]);
        t.blk_hi = std::max(t.blk_hi, m.blk[i]);
      } else {
        t.one_blk = false;
      }
    }
    t.one_blk = t.one_blk && t.blk_lo == t.blk_hi;
    tiles[b] = t;
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

inline bool visible(AttnMeta qm, int64_t i, AttnMeta km, int64_t j) {
  if (qm.doc[i] != km.doc[j]) return false;
  return km.idx[j] <= qm.idx[i] || (qm.blk[i] >= 0 && qm.blk[i] == km.blk[j]);
}

// Per-thread buffers of one tile. K and V are transposed into (hd, kBk) so the inner loops
// run over contiguous keys, which the compiler turns into SIMD without reordering any sum.
struct TileWork {
  std::vector<float> kt, vt;  // (hd, kBk)
  std::vector<float> s;       // (kBq, kBk) scores, then probabilities
  std::vector<float> dp;      // (kBk) dO_i · v_j of one query row
  explicit TileWork(int hd) : kt(hd * kBk), vt(hd * kBk), s(kBq * kBk), dp(kBk) {}
};

void load_tile(float* dst, const float* src, const AttnShape& sh, int kvh, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* row = src + (j * sh.Hkv + kvh) * sh.hd;
    for (int d = 0; d < sh.hd; ++d) dst[d * kBk + (j - j0)] = row[d];
  }
}

// Scores of one tile: s (rows, kBk) = scale · q_i · k_j, or -inf where the mask hides (i, j).
// Expects w.kt to hold the key tile.
void tile_scores(TileWork& w, const float* q, AttnMeta qm, AttnMeta km, const AttnShape& sh,
                 int h, int64_t i0, int64_t i1, int64_t j0, int64_t j1, bool all_visible) {
  const int64_t nj = j1 - j0;
  for (int64_t i = i0; i < i1; ++i) {
    const float* qi = q + (i * sh.Hq + h) * sh.hd;
    float* row = w.s.data() + (i - i0) * kBk;
    std::fill_n(row, nj, 0.0f);
    for (int d = 0; d < sh.hd; ++d) {
      const float qd = sh.scale * qi[d];
      const float* kd = w.kt.data() + d * kBk;
      for (int64_t j = 0; j < nj; ++j) row[j] += qd * kd[j];
    }
    if (!all_visible)
      for (int64_t j = 0; j < nj; ++j)
        if (!visible(qm, i, km, j0 + j)) row[j] = kNegInf;
  }
}

// dp (nj) = dO_i · v_j for every key of the tile; expects w.vt to hold the value tile.
void tile_dp(TileWork& w, const float* doi, int hd, int64_t nj) {
  std::fill_n(w.dp.data(), nj, 0.0f);
  for (int d = 0; d < hd; ++d) {
    const float g = doi[d];
    const float* vd = w.vt.data() + d * kBk;
    for (int64_t j = 0; j < nj; ++j) w.dp[j] += g * vd[j];
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       AttnMeta qm, AttnMeta km, const AttnShape& sh) {
  const auto qt = summarise(qm, sh.Tq, kBq);
  const auto kt = summarise(km, sh.Tk, kBk);
  const int64_t nqb = qt.size(), nkb = kt.size();
  const int hd = sh.hd;
#pragma omp parallel
  {
    TileWork w(hd);
    std::vector<float> m(kBq), l(kBq), acc(kBq * hd);  // running max, sum, output per row
#pragma omp for collapse(2) schedule(dynamic)
    for (int h = 0; h < sh.Hq; ++h)
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int kvh = h / (sh.Hq / sh.Hkv);
        const int64_t i0 = qb * kBq, i1 = std::min(sh.Tq, i0 + kBq);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t kb = 0; kb < nkb; ++kb) {
          if (!may_see(qt[qb], kt[kb])) continue;
          const int64_t j0 = kb * kBk, j1 = std::min(sh.Tk, j0 + kBk), nj = j1 - j0;
          load_tile(w.kt.data(), k, sh, kvh, j0, j1);
          tile_scores(w, q, qm, km, sh, h, i0, i1, j0, j1, sees_all(qt[qb], kt[kb]));
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t r = i - i0;
            float* row = w.s.data() + r * kBk;
            float mx = m[r];
            for (int64_t j = 0; j < nj; ++j) mx = std::max(mx, row[j]);
            if (mx == kNegInf) continue;  // nothing visible yet in this row
            const float alpha = std::exp(m[r] - mx);  // 0 when m was -inf
            float* a = acc.data() + r * hd;
            for (int d = 0; d < hd; ++d) a[d] *= alpha;
            float sum = l[r] * alpha;
            for (int64_t j = 0; j < nj; ++j) {
              if (row[j] == kNegInf) continue;
              const float p = std::exp(row[j] - mx);
              sum += p;
              const float* vj = v + ((j0 + j) * sh.Hkv + kvh) * hd;
              for (int d = 0; d < hd; ++d) a[d] += p * vj[d];
            }
            l[r] = sum;
            m[r] = mx;
          }
        }
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t r = i - i0;
          float* o = out + (i * sh.Hq + h) * hd;
          const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
          for (int d = 0; d < hd; ++d) o[d] = acc[r * hd + d] * inv;
          lse[int64_t(h) * sh.Tq + i] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
        }
      }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        AttnMeta qm, AttnMeta km, const AttnShape& sh) {
  const auto qt = summarise(qm, sh.Tq, kBq);
  const auto kt = summarise(km, sh.Tk, kBk);
  const int64_t nqb = qt.size(), nkb = kt.size();
  const int hd = sh.hd, group = sh.Hq / sh.Hkv;

  // D (Hq, Tq) = rowsum(dout · out): the softmax backward's correction term.
  std::vector<float> D(int64_t(sh.Hq) * sh.Tq);
#pragma omp parallel for collapse(2) schedule(static)
  for (int h = 0; h < sh.Hq; ++h)
    for (int64_t i = 0; i < sh.Tq; ++i) {
      const float* a = dout + (i * sh.Hq + h) * hd;
      const float* b = out + (i * sh.Hq + h) * hd;
      float s = 0.0f;
      for (int d = 0; d < hd; ++d) s += a[d] * b[d];
      D[h * sh.Tq + i] = s;
    }

  // Two passes so every output row is owned by one thread (no atomics, deterministic):
  // pass 1 writes dq per (head, query tile), pass 2 writes dk/dv per (kv head, key tile).
  // Both recompute the probabilities of a tile from q, k and the saved log-sum-exp.
#pragma omp parallel
  {
    TileWork w(hd);
#pragma omp for collapse(2) schedule(dynamic)
    for (int h = 0; h < sh.Hq; ++h)
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int kvh = h / group;
        const int64_t i0 = qb * kBq, i1 = std::min(sh.Tq, i0 + kBq);
        for (int64_t i = i0; i < i1; ++i) std::fill_n(dq + (i * sh.Hq + h) * hd, hd, 0.0f);
        for (int64_t kb = 0; kb < nkb; ++kb) {
          if (!may_see(qt[qb], kt[kb])) continue;
          const int64_t j0 = kb * kBk, j1 = std::min(sh.Tk, j0 + kBk), nj = j1 - j0;
          load_tile(w.kt.data(), k, sh, kvh, j0, j1);
          load_tile(w.vt.data(), v, sh, kvh, j0, j1);
          tile_scores(w, q, qm, km, sh, h, i0, i1, j0, j1, sees_all(qt[qb], kt[kb]));
          for (int64_t i = i0; i < i1; ++i) {
            const float L = lse[int64_t(h) * sh.Tq + i];
            if (L == kNegInf) continue;
            const float* doi = dout + (i * sh.Hq + h) * hd;
            float* dqi = dq + (i * sh.Hq + h) * hd;
            const float Di = D[h * sh.Tq + i];
            const float* row = w.s.data() + (i - i0) * kBk;
            tile_dp(w, doi, hd, nj);
            for (int64_t j = 0; j < nj; ++j) {
              if (row[j] == kNegInf) continue;
              const float ds = std::exp(row[j] - L) * (w.dp[j] - Di) * sh.scale;
              const float* kj = k + ((j0 + j) * sh.Hkv + kvh) * hd;
              for (int d = 0; d < hd; ++d) dqi[d] += ds * kj[d];
            }
          }
        }
      }

#pragma omp for collapse(2) schedule(dynamic)
    for (int kvh = 0; kvh < sh.Hkv; ++kvh)
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, j1 = std::min(sh.Tk, j0 + kBk), nj = j1 - j0;
        for (int64_t j = j0; j < j1; ++j) {
          std::fill_n(dk + (j * sh.Hkv + kvh) * hd, hd, 0.0f);
          std::fill_n(dv + (j * sh.Hkv + kvh) * hd, hd, 0.0f);
        }
        load_tile(w.kt.data(), k, sh, kvh, j0, j1);
        load_tile(w.vt.data(), v, sh, kvh, j0, j1);
        for (int h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int64_t qb = 0; qb < nqb; ++qb) {
            if (!may_see(qt[qb], kt[kb])) continue;
            const int64_t i0 = qb * kBq, i1 = std::min(sh.Tq, i0 + kBq);
            tile_scores(w, q, qm, km, sh, h, i0, i1, j0, j1, sees_all(qt[qb], kt[kb]));
            for (int64_t i = i0; i < i1; ++i) {
              const float L = lse[int64_t(h) * sh.Tq + i];
              if (L == kNegInf) continue;
              const float* doi = dout + (i * sh.Hq + h) * hd;
              const float* qi = q + (i * sh.Hq + h) * hd;
              const float Di = D[h * sh.Tq + i];
              const float* row = w.s.data() + (i - i0) * kBk;
              tile_dp(w, doi, hd, nj);
              for (int64_t j = 0; j < nj; ++j) {
                if (row[j] == kNegInf) continue;
                const float p = std::exp(row[j] - L);
                const float ds = p * (w.dp[j] - Di) * sh.scale;
                float* dvj = dv + ((j0 + j) * sh.Hkv + kvh) * hd;
                float* dkj = dk + ((j0 + j) * sh.Hkv + kvh) * hd;
                for (int d = 0; d < hd; ++d) {
                  dvj[d] += p * doi[d];
                  dkj[d] += ds * qi[d];
                }
              }
            }
          }
      }
  }
}

}  // namespace dhp::cpu
