// The blocked attention kernel against a naive reference, its log-sum-exp merge contract
// (what ring attention relies on), and finite-difference gradients for every mask kind.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/attention.h"
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

}  // namespace
}  // namespace dhp
