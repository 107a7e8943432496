// The blocked attention kernel against a naive reference, its log-sum-exp merge contract
// (what ring attention relies on), and finite-difference gradients for every mask kind; then
// forward and backward against a double-precision reference on the shapes that stress the
// tiling (tile edges, many short documents, long image blocks, GQA, rows that see nothing,
// idx with gaps, separate query and key metadata), for every instruction-set variant the
// machine runs, and bit-identical results for any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <limits>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_tuning.h"
#include "tests/grad_check.h"

namespace dhp {
namespace {

using namespace dhp::cpu;
using testing::expect_gradient;
using testing::random_vec;
using testing::weighted_sum;

enum class Kind { Causal, Bidirectional, Mixed };

struct Meta {
  std::vector<int32_t> doc, idx, blk;
  AttnMeta view() const { return AttnMeta{doc.data(), idx.data(), blk.data()}; }
  int64_t size() const { return int64_t(doc.size()); }
};

// A packed sequence of random segments: causal text documents, stand-alone images (one
// bidirectional block each) or documents of text with an image block inside.
Meta random_pack(Rng& rng, Kind kind, int64_t T) {
  Meta m;
  int32_t doc = 0, blk = 0;
  while (m.size() < T) {
    const int64_t len = std::min<int64_t>(T - m.size(), rng.range(1, 90));
    const Kind k = kind == Kind::Mixed ? Kind(rng.range(0, 2)) : kind;
    for (int64_t i = 0; i < len; ++i) {
      m.idx.push_back(int32_t(m.size()));
      m.doc.push_back(doc);
    }
    if (k == Kind::Bidirectional) {
      for (int64_t i = 0; i < len; ++i) m.blk.push_back(blk);
      ++blk;
    } else if (k == Kind::Mixed && len >= 6) {
      // Text, then an image block, then text, all one document.
      const int64_t a = rng.range(1, len / 2), b = rng.range(a + 1, len - 1);
      for (int64_t i = 0; i < len; ++i) m.blk.push_back(i >= a && i < b ? blk : -1);
      ++blk;
    } else {
      for (int64_t i = 0; i < len; ++i) m.blk.push_back(-1);
    }
    ++doc;
  }
  return m;
}

bool sees(const Meta& q, int64_t i, const Meta& k, int64_t j) {
  return q.doc[i] == k.doc[j] && (k.idx[j] <= q.idx[i] || (q.blk[i] >= 0 && q.blk[i] == k.blk[j]));
}

// Naive O(Tq·Tk) reference in double.
void naive(std::vector<double>& out, std::vector<double>& lse, const std::vector<float>& q,
           const std::vector<float>& k, const std::vector<float>& v, const Meta& qm,
           const Meta& km, const AttnShape& s) {
  out.assign(s.Tq * s.Hq * s.hd, 0.0);
  lse.assign(s.Hq * s.Tq, -std::numeric_limits<double>::infinity());
  for (int h = 0; h < s.Hq; ++h) {
    const int kvh = h / (s.Hq / s.Hkv);
    for (int64_t i = 0; i < s.Tq; ++i) {
      std::vector<double> sc(s.Tk, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < s.Tk; ++j) {
        if (!sees(qm, i, km, j)) continue;
        double d = 0;
        for (int c = 0; c < s.hd; ++c)
          d += double(q[(i * s.Hq + h) * s.hd + c]) * k[(j * s.Hkv + kvh) * s.hd + c];
        sc[j] = d * s.scale;
        mx = std::max(mx, sc[j]);
      }
      if (mx == -INFINITY) continue;
      double sum = 0;
      for (int64_t j = 0; j < s.Tk; ++j) sum += sc[j] == -INFINITY ? 0 : std::exp(sc[j] - mx);
      lse[h * s.Tq + i] = mx + std::log(sum);
      for (int64_t j = 0; j < s.Tk; ++j) {
        if (sc[j] == -INFINITY) continue;
        double p = std::exp(sc[j] - mx) / sum;
        for (int c = 0; c < s.hd; ++c)
          out[(i * s.Hq + h) * s.hd + c] += p * v[(j * s.Hkv + kvh) * s.hd + c];
      }
    }
  }
}

class AttentionKinds : public ::testing::TestWithParam<Kind> {};

TEST_P(AttentionKinds, BlockedEqualsNaive) {
  Rng rng(11 + int(GetParam()));
  for (int64_t T : {1, 31, 64, 97, 300}) {
    const Meta m = random_pack(rng, GetParam(), T);
    const AttnShape s{T, T, 4, 2, 8, float(1 / std::sqrt(8.0))};
    auto q = random_vec(rng, T * 4 * 8, 2.0f), k = random_vec(rng, T * 2 * 8, 2.0f),
         v = random_vec(rng, T * 2 * 8);
    std::vector<float> out(q.size()), lse(4 * T);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), m.view(), m.view(), s);
    std::vector<double> ro, rl;
    naive(ro, rl, q, k, v, m, m, s);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ro[i], 2e-5) << "T=" << T;
    for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], rl[i], 2e-5) << "T=" << T;
  }
}

TEST_P(AttentionKinds, Gradients) {
  Rng rng(21 + int(GetParam()));
  const int64_t T = 70;
  const Meta m = random_pack(rng, GetParam(), T);
  const AttnShape s{T, T, 4, 2, 4, 0.5f};
  auto q = random_vec(rng, T * 4 * 4), k = random_vec(rng, T * 2 * 4), v = random_vec(rng, T * 2 * 4);
  auto r = random_vec(rng, T * 4 * 4);
  std::vector<float> out(q.size()), lse(4 * T);
  auto loss = [&] {
    std::vector<float> o(q.size()), l(4 * T);
    attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), m.view(), m.view(), s);
    return weighted_sum(o, r);
  };
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), m.view(), m.view(), s);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward(dq.data(), dk.data(), dv.data(), r.data(), out.data(), lse.data(), q.data(),
                     k.data(), v.data(), m.view(), m.view(), s);
  expect_gradient("attention dq", q, dq, loss, 60);
  expect_gradient("attention dk", k, dk, loss, 60);
  expect_gradient("attention dv", v, dv, loss, 60);
}

// Splitting the keys in two, attending to each half and merging with the log-sum-exp gives
// the full result: the contract ring attention builds on.
TEST_P(AttentionKinds, LogSumExpMergeOfKeyChunks) {
  Rng rng(31 + int(GetParam()));
  const int64_t T = 200, split = 83;
  const Meta m = random_pack(rng, GetParam(), T);
  Meta a, b;
  for (int64_t j = 0; j < T; ++j) {
    Meta& dst = j < split ? a : b;
    dst.doc.push_back(m.doc[j]);
    dst.idx.push_back(m.idx[j]);
    dst.blk.push_back(m.blk[j]);
  }
  const int Hq = 2, Hkv = 1, hd = 8;
  auto q = random_vec(rng, T * Hq * hd), k = random_vec(rng, T * Hkv * hd),
       v = random_vec(rng, T * Hkv * hd);
  std::vector<float> full(q.size()), lfull(Hq * T), oa(q.size()), la(Hq * T), ob(q.size()), lb(Hq * T);
  attention_forward(full.data(), lfull.data(), q.data(), k.data(), v.data(), m.view(), m.view(),
                    AttnShape{T, T, Hq, Hkv, hd, 0.35f});
  attention_forward(oa.data(), la.data(), q.data(), k.data(), v.data(), m.view(), a.view(),
                    AttnShape{T, split, Hq, Hkv, hd, 0.35f});
  attention_forward(ob.data(), lb.data(), q.data(), k.data() + split * Hkv * hd,
                    v.data() + split * Hkv * hd, m.view(), b.view(),
                    AttnShape{T, T - split, Hq, Hkv, hd, 0.35f});
  for (int h = 0; h < Hq; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const double x = la[h * T + i], y = lb[h * T + i];
      const double mx = std::max(x, y);
      const double l = mx + std::log(std::exp(x - mx) + std::exp(y - mx));
      ASSERT_NEAR(l, lfull[h * T + i], 1e-5);
      for (int c = 0; c < hd; ++c) {
        const size_t o = (i * Hq + h) * hd + c;
        ASSERT_NEAR(std::exp(x - l) * oa[o] + std::exp(y - l) * ob[o], full[o], 1e-5);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Masks, AttentionKinds,
                         ::testing::Values(Kind::Causal, Kind::Bidirectional, Kind::Mixed),
                         [](const auto& info) {
                           return std::string(info.param == Kind::Causal ? "CausalDocuments"
                                              : info.param == Kind::Bidirectional ? "ImageBlocks"
                                                                                  : "Mixed");
                         });

TEST(Attention, RowThatSeesNothingIsZeroWithMinusInfinityLse) {
  Meta qm{{0}, {5}, {-1}}, km{{1}, {0}, {-1}};  // different documents
  std::vector<float> q(4, 1.0f), k(4, 1.0f), v(4, 1.0f), out(4, 9.0f), lse(1, 0.0f);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), qm.view(), km.view(),
                    AttnShape{1, 1, 1, 1, 4, 0.5f});
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
}

// ---- the tiled paths against a double-precision reference ----------------------------------

struct Grads {
  std::vector<double> dq, dk, dv;
};

// Naive backward in double from the naive forward's probabilities.
Grads naive_backward(const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, const std::vector<float>& dout, const Meta& qm,
                     const Meta& km, const AttnShape& s) {
  Grads g{std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(v.size())};
  std::vector<double> out, lse;
  naive(out, lse, q, k, v, qm, km, s);
  for (int h = 0; h < s.Hq; ++h) {
    const int kvh = h / (s.Hq / s.Hkv);
    for (int64_t i = 0; i < s.Tq; ++i) {
      const double L = lse[h * s.Tq + i];
      if (L == -INFINITY) continue;
      const size_t qi = (i * s.Hq + h) * s.hd;
      double D = 0;
      for (int c = 0; c < s.hd; ++c) D += double(dout[qi + c]) * out[qi + c];
      for (int64_t j = 0; j < s.Tk; ++j) {
        if (!sees(qm, i, km, j)) continue;
        const size_t kj = (j * s.Hkv + kvh) * s.hd;
        double sc = 0, dp = 0;
        for (int c = 0; c < s.hd; ++c) {
          sc += double(q[qi + c]) * k[kj + c];
          dp += double(dout[qi + c]) * v[kj + c];
        }
        const double p = std::exp(sc * s.scale - L), ds = p * (dp - D) * s.scale;
        for (int c = 0; c < s.hd; ++c) {
          g.dq[qi + c] += ds * k[kj + c];
          g.dk[kj + c] += ds * q[qi + c];
          g.dv[kj + c] += p * dout[qi + c];
        }
      }
    }
  }
  return g;
}

// |got - want| <= tol · (1 + max |want|): float accumulation over up to a few hundred keys of
// O(1) terms loses ~1e-6 relative; 2e-5 leaves room and still catches any wrong term.
void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<double>& want, double tol = 2e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 0;
  for (double w : want) mx = std::max(mx, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + mx)) << what << " at " << i;
}

struct Case {
  std::string name;
  Meta qm, km;
  int Hq, Hkv, hd;
};

Meta concat(std::vector<Meta> parts) {
  Meta m;
  for (const auto& p : parts) {
    m.doc.insert(m.doc.end(), p.doc.begin(), p.doc.end());
    m.idx.insert(m.idx.end(), p.idx.begin(), p.idx.end());
    m.blk.insert(m.blk.end(), p.blk.begin(), p.blk.end());
  }
  return m;
}

// A document of n tokens at positions idx0, idx0 + step, ...; blk >= 0 makes it one image.
Meta doc(int32_t d, int64_t n, int32_t idx0 = 0, int32_t step = 1, int32_t blk = -1) {
  Meta m;
  for (int64_t i = 0; i < n; ++i) {
    m.doc.push_back(d);
    m.idx.push_back(idx0 + int32_t(i) * step);
    m.blk.push_back(blk);
  }
  return m;
}

std::vector<Case> stress_cases() {
  Rng rng(77);
  std::vector<Case> c;
  // One causal document whose length sits on and around the 64-token tile edges.
  for (int64_t T : {63, 64, 65, 128, 129, 200})
    c.push_back({"causal T=" + std::to_string(T), doc(0, T), doc(0, T), 2, 1, 32});
  // Many short documents (1..5 tokens): tiles of a few tokens, many tile pairs.
  {
    std::vector<Meta> parts;
    for (int d = 0; d < 60; ++d) parts.push_back(doc(d, rng.range(1, 5)));
    const Meta m = concat(parts);
    c.push_back({"short documents", m, m, 4, 2, 16});
  }
  // Images longer than a tile (bidirectional across tile edges) next to text documents.
  {
    const Meta m = concat({doc(0, 150, 0, 1, 0), doc(1, 30), doc(2, 70, 0, 1, 1), doc(3, 64, 0, 1, 2)});
    c.push_back({"image blocks", m, m, 4, 4, 16});
  }
  // Text, an image inside the document, text: mixed causal and bidirectional tiles.
  {
    Meta m = doc(0, 160);
    for (int i = 40; i < 120; ++i) m.blk[size_t(i)] = 0;
    c.push_back({"image inside text", m, m, 3, 1, 24});
  }
  // GQA with 4 query heads per kv head, and head dims that need padding or several chunks.
  for (int hd : {4, 8, 20, 64, 80}) {
    const Meta m = concat({doc(0, 90), doc(1, 45), doc(2, 10)});
    c.push_back({"gqa hd=" + std::to_string(hd), m, m, 8, 2, hd});
  }
  // Separate query and key metadata (a ring step): queries see a remote chunk of keys whose
  // positions have gaps; some query documents have no key at all (rows that see nothing).
  {
    const Meta qm = concat({doc(0, 70, 100), doc(1, 50, 0), doc(5, 20, 0)});
    const Meta km = concat({doc(0, 90, 40, 2), doc(1, 30, 30), doc(7, 15, 0)});
    c.push_back({"remote keys", qm, km, 4, 2, 32});
  }
  // Many heads on short documents, the shapes of a wide decoder: rows read and written in
  // place at a stride of H·hd (hd = 32, 64), or through padded copies (hd = 24), each head
  // a slice of a long row.
  for (int hd : {32, 64, 24}) {
    std::vector<Meta> parts;
    for (int d = 0; d < 6; ++d) parts.push_back(doc(d, rng.range(20, 80)));
    const Meta m = concat(parts);
    c.push_back({"many heads hd=" + std::to_string(hd), m, m, 16, 8, hd});
  }
  // A document long enough that every query tile sees many key tiles: the backward pass then
  // reads per-head copies of q, dout and K instead of the rows in place.
  c.push_back({"long document", doc(0, 1000), doc(0, 1000), 2, 1, 64});
  // Many heads on image blocks (hd = 16, in place), next to a caption in the same document.
  {
    Meta m = concat({doc(0, 36, 0, 1, 0), doc(1, 50), doc(2, 100, 0, 1, 2)});
    for (int i = 80; i < 100; ++i) m.blk[size_t(36 + 50 + i)] = -1;
    c.push_back({"many heads images", m, m, 12, 12, 16});
  }
  // Query and key tiles of one causal document whose positions are offset by `off`: row r
  // sees key column j <= r - off, a staircase that starts, ends or crosses the 16-row steps
  // of the computed part at every kind of place (and rows that see none of a tile).
  for (int32_t off : {-90, -33, -16, -1, 1, 15, 16, 17, 50}) {
    const Meta qm = doc(0, 100, 100), km = doc(0, 110, 100 + off);
    c.push_back({"causal keys offset " + std::to_string(off), qm, km, 2, 1, 32});
  }
  // Keys all in the future of the queries: every row sees nothing.
  {
    const Meta qm = doc(0, 40, 0), km = doc(0, 70, 50);
    c.push_back({"nothing visible", qm, km, 2, 2, 16});
  }
  return c;
}

void check_case(const Case& c, Rng& rng) {
  const AttnShape s{c.qm.size(), c.km.size(), c.Hq, c.Hkv, c.hd, float(1 / std::sqrt(double(c.hd)))};
  auto q = random_vec(rng, s.Tq * s.Hq * s.hd, 2.0f), k = random_vec(rng, s.Tk * s.Hkv * s.hd, 2.0f),
       v = random_vec(rng, s.Tk * s.Hkv * s.hd), dout = random_vec(rng, s.Tq * s.Hq * s.hd);
  std::vector<float> out(q.size(), 7.0f), lse(size_t(s.Hq * s.Tq), 7.0f);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), c.qm.view(), c.km.view(), s);
  std::vector<double> ro, rl;
  naive(ro, rl, q, k, v, c.qm, c.km, s);
  expect_close(c.name + " out", out, ro);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (rl[i] == -INFINITY)
      ASSERT_EQ(lse[i], -std::numeric_limits<float>::infinity()) << c.name << " lse " << i;
    else
      ASSERT_NEAR(lse[i], rl[i], 2e-5 * (1 + std::abs(rl[i]))) << c.name << " lse " << i;
  }
  // Gradients are written, not accumulated: start from garbage.
  std::vector<float> dq(q.size(), 7.0f), dk(k.size(), 7.0f), dv(v.size(), 7.0f);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                     k.data(), v.data(), c.qm.view(), c.km.view(), s);
  const Grads g = naive_backward(q, k, v, dout, c.qm, c.km, s);
  expect_close(c.name + " dq", dq, g.dq);
  expect_close(c.name + " dk", dk, g.dk);
  expect_close(c.name + " dv", dv, g.dv);
}

const char* isa_name(AttnIsa isa) {
  return isa == AttnIsa::avx512 ? "avx512" : isa == AttnIsa::avx2 ? "avx2" : "generic";
}

// Every variant the machine can run, against the reference (a variant the machine lacks
// falls back to the best it has, so that case only repeats another).
TEST(AttentionTiles, EveryVariantMatchesTheReferenceOnStressShapes) {
  for (AttnIsa isa : {AttnIsa::generic, AttnIsa::avx2, AttnIsa::avx512}) {
    set_attention_isa(isa);
    SCOPED_TRACE(isa_name(attention_isa()));
    Rng rng(5);
    for (const Case& c : stress_cases()) {
      SCOPED_TRACE(c.name);
      check_case(c, rng);
      if (HasFatalFailure()) break;
    }
  }
  set_attention_isa(AttnIsa::best);
}

// The tiling and the order of every sum depend on the shapes only: one thread and two give
// the same bits, forward and backward.
TEST(AttentionTiles, SameBitsForAnyThreadCount) {
  Rng rng(9);
  for (const Case& c : stress_cases()) {
    const AttnShape s{c.qm.size(), c.km.size(), c.Hq, c.Hkv, c.hd, 0.3f};
    auto q = random_vec(rng, s.Tq * s.Hq * s.hd), k = random_vec(rng, s.Tk * s.Hkv * s.hd),
         v = random_vec(rng, s.Tk * s.Hkv * s.hd), dout = random_vec(rng, s.Tq * s.Hq * s.hd);
    std::vector<std::vector<float>> runs[2];
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<float> out(q.size()), lse(size_t(s.Hq * s.Tq)), dq(q.size()), dk(k.size()),
          dv(v.size());
      attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), c.qm.view(), c.km.view(), s);
      attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                         q.data(), k.data(), v.data(), c.qm.view(), c.km.view(), s);
      runs[threads - 1] = {out, lse, dq, dk, dv};
    }
    for (size_t t = 0; t < runs[0].size(); ++t)
      EXPECT_TRUE(runs[0][t] == runs[1][t]) << c.name << " output " << t << " differs";
  }
  omp_set_num_threads(omp_get_num_procs());
}

// The backward pass takes the key tiles in batches so the kept dS of every head stays
// bounded; dq then continues across batches, which must not change a bit (batches of one key
// tile, of a few tile pairs, and one batch for everything).
TEST(AttentionTiles, BatchesOfKeyTilesGiveTheSameBits) {
  Rng rng(13);
  const int64_t budget = attention_kept_ds_floats();
  for (const Case& c : stress_cases()) {
    const AttnShape s{c.qm.size(), c.km.size(), c.Hq, c.Hkv, c.hd, 0.3f};
    auto q = random_vec(rng, s.Tq * s.Hq * s.hd), k = random_vec(rng, s.Tk * s.Hkv * s.hd),
         v = random_vec(rng, s.Tk * s.Hkv * s.hd), dout = random_vec(rng, s.Tq * s.Hq * s.hd);
    std::vector<float> out(q.size()), lse(size_t(s.Hq * s.Tq));
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), c.qm.view(), c.km.view(), s);
    std::vector<std::vector<float>> first;
    for (int64_t floats : {int64_t(1) << 40, budget, int64_t(1), int64_t(3) * 64 * 64 * c.Hq}) {
      set_attention_kept_ds_floats(floats);
      std::vector<float> dq(q.size(), 7.0f), dk(k.size(), 7.0f), dv(v.size(), 7.0f);
      attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                         q.data(), k.data(), v.data(), c.qm.view(), c.km.view(), s);
      if (first.empty()) {
        first = {dq, dk, dv};
        continue;
      }
      EXPECT_TRUE(first[0] == dq) << c.name << " dq differs with a budget of " << floats;
      EXPECT_TRUE(first[1] == dk) << c.name << " dk differs with a budget of " << floats;
      EXPECT_TRUE(first[2] == dv) << c.name << " dv differs with a budget of " << floats;
    }
  }
  set_attention_kept_ds_floats(budget);
}

}  // namespace
}  // namespace dhp
