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
};

std::vector<Tile> summarise(AttnMeta m, int64_t T, int64_t B) {
  std::vector<Tile> tiles((T + B - 1) / B);
  for (size_t b = 0; b < tiles.size(); ++b) {
    Tile t{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, false};
    for (int64_t i = b * B; i < std::min<int64_t>(T, (b + 1) * B); ++i) {
      t.doc_lo = std::min(t.doc_lo, m.doc[i]);
      t.doc_hi = std::max(t.doc_hi, m.doc[i]);
      t.idx_lo = std::min(t.idx_lo, m.idx[i]);
      t.idx_hi = std::max(t.idx_hi, m.idx[i]);
      if (m.blk[i] >= 0) {
        t.any_blk = true;
        t.blk_lo = std::min(t.blk_lo, m.blk[i]);
        t.blk_hi = std::max(t.blk_hi, m.blk[i]);
      }
    }
    tiles[b] = t;
  }
  return tiles;
}

bool may_see(const Tile& q, const Tile& k) {
  if (q.doc_hi < k.doc_lo || k.doc_hi < q.doc_lo) return false;
  if (k.idx_lo <= q.idx_hi) return true;
  return q.any_blk && k.any_blk && !(q.blk_hi < k.blk_lo || k.blk_hi < q.blk_lo);
}

inline bool visible(AttnMeta qm, int64_t i, AttnMeta km, int64_t j) {
  if (qm.doc[i] != km.doc[j]) return false;
  return km.idx[j] <= qm.idx[i] || (qm.blk[i] >= 0 && qm.blk[i] == km.blk[j]);
}

inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Scores of one tile: s (rows, cols) = scale · q_i · k_j, or -inf where the mask hides (i, j).
void tile_scores(float* s, const float* q, const float* k, AttnMeta qm, AttnMeta km,
                 const AttnShape& sh, int h, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int kvh = h / (sh.Hq / sh.Hkv);
  for (int64_t i = i0; i < i1; ++i) {
    const float* qi = q + (i * sh.Hq + h) * sh.hd;
    float* row = s + (i - i0) * kBk;
    for (int64_t j = j0; j < j1; ++j)
      row[j - j0] = visible(qm, i, km, j)
                        ? sh.scale * dot(qi, k + (j * sh.Hkv + kvh) * sh.hd, sh.hd)
                        : kNegInf;
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
    std::vector<float> s(kBq * kBk), m(kBq), l(kBq), acc(kBq * hd);  // per-thread tile state
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
          const int64_t j0 = kb * kBk, j1 = std::min(sh.Tk, j0 + kBk);
          tile_scores(s.data(), q, k, qm, km, sh, h, i0, i1, j0, j1);
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t r = i - i0;
            float* row = s.data() + r * kBk;
            float mx = m[r];
            for (int64_t j = j0; j < j1; ++j) mx = std::max(mx, row[j - j0]);
            if (mx == kNegInf) continue;  // nothing visible yet in this row
            const float alpha = std::exp(m[r] - mx);  // 0 when m was -inf
            float* a = acc.data() + r * hd;
            for (int d = 0; d < hd; ++d) a[d] *= alpha;
            float sum = l[r] * alpha;
            for (int64_t j = j0; j < j1; ++j) {
              if (row[j - j0] == kNegInf) continue;
              const float p = std::exp(row[j - j0] - mx);
              sum += p;
              const float* vj = v + (j * sh.Hkv + kvh) * hd;
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
    for (int64_t i = 0; i < sh.Tq; ++i)
      D[h * sh.Tq + i] = dot(dout + (i * sh.Hq + h) * hd, out + (i * sh.Hq + h) * hd, hd);

  // Two passes so every output row is owned by one thread (no atomics, deterministic):
  // pass 1 writes dq per (head, query tile), pass 2 writes dk/dv per (kv head, key tile).
#pragma omp parallel
  {
    std::vector<float> s(kBq * kBk);
#pragma omp for collapse(2) schedule(dynamic)
    for (int h = 0; h < sh.Hq; ++h)
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int kvh = h / group;
        const int64_t i0 = qb * kBq, i1 = std::min(sh.Tq, i0 + kBq);
        for (int64_t i = i0; i < i1; ++i) std::fill_n(dq + (i * sh.Hq + h) * hd, hd, 0.0f);
        for (int64_t kb = 0; kb < nkb; ++kb) {
          if (!may_see(qt[qb], kt[kb])) continue;
          const int64_t j0 = kb * kBk, j1 = std::min(sh.Tk, j0 + kBk);
          tile_scores(s.data(), q, k, qm, km, sh, h, i0, i1, j0, j1);
          for (int64_t i = i0; i < i1; ++i) {
            const float L = lse[int64_t(h) * sh.Tq + i];
            if (L == kNegInf) continue;
            const float* doi = dout + (i * sh.Hq + h) * hd;
            float* dqi = dq + (i * sh.Hq + h) * hd;
            const float Di = D[h * sh.Tq + i];
            for (int64_t j = j0; j < j1; ++j) {
              const float sc = s[(i - i0) * kBk + (j - j0)];
              if (sc == kNegInf) continue;
              const float p = std::exp(sc - L);
              const float ds = p * (dot(doi, v + (j * sh.Hkv + kvh) * hd, hd) - Di) * sh.scale;
              const float* kj = k + (j * sh.Hkv + kvh) * hd;
              for (int d = 0; d < hd; ++d) dqi[d] += ds * kj[d];
            }
          }
        }
      }

#pragma omp for collapse(2) schedule(dynamic)
    for (int kvh = 0; kvh < sh.Hkv; ++kvh)
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, j1 = std::min(sh.Tk, j0 + kBk);
        for (int64_t j = j0; j < j1; ++j) {
          std::fill_n(dk + (j * sh.Hkv + kvh) * hd, hd, 0.0f);
          std::fill_n(dv + (j * sh.Hkv + kvh) * hd, hd, 0.0f);
        }
        for (int h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int64_t qb = 0; qb < nqb; ++qb) {
            if (!may_see(qt[qb], kt[kb])) continue;
            const int64_t i0 = qb * kBq, i1 = std::min(sh.Tq, i0 + kBq);
            tile_scores(s.data(), q, k, qm, km, sh, h, i0, i1, j0, j1);
            for (int64_t i = i0; i < i1; ++i) {
              const float L = lse[int64_t(h) * sh.Tq + i];
              if (L == kNegInf) continue;
              const float* doi = dout + (i * sh.Hq + h) * hd;
              const float* qi = q + (i * sh.Hq + h) * hd;
              const float Di = D[h * sh.Tq + i];
              for (int64_t j = j0; j < j1; ++j) {
                const float sc = s[(i - i0) * kBk + (j - j0)];
                if (sc == kNegInf) continue;
                const float p = std::exp(sc - L);
                float* dvj = dv + (j * sh.Hkv + kvh) * hd;
                float* dkj = dk + (j * sh.Hkv + kvh) * hd;
                const float ds = p * (dot(doi, v + (j * sh.Hkv + kvh) * hd, hd) - Di) * sh.scale;
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
