// Packed attention batches shared by the CUDA attention tests (the device test and the CPU
// emulation of the kernels): random documents of uneven lengths, causal text, bidirectional
// image blocks, GQA, separate query and key metadata, rows that see no key; and the CPU
// reference's results on them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_merge.h"
#include "tests/grad_check.h"

namespace dhp::testing {

struct PackMeta {
  std::vector<int32_t> doc, idx, blk;
  AttnMeta view() const { return AttnMeta{doc.data(), idx.data(), blk.data()}; }
  int64_t size() const { return int64_t(doc.size()); }
};

// T tokens of documents of 1 .. max_len tokens numbered from doc0, positions from idx0 in
// steps of `step`; with images, about a third of the documents are one image (a bidirectional
// block) and a third are text with an image block inside.
inline PackMeta random_pack(Rng& rng, int64_t T, int64_t max_len, bool images, int32_t doc0 = 0,
                            int32_t idx0 = 0, int32_t step = 1) {
  PackMeta m;
  int32_t doc = doc0, blk = 0;
  while (m.size() < T) {
    const int64_t len = std::min<int64_t>(T - m.size(), rng.range(1, max_len));
    const int kind = images ? int(rng.range(0, 2)) : 0;  // 0 text, 1 image, 2 text + image
    const int64_t a = kind == 2 && len >= 6 ? rng.range(1, len / 2) : 0;
    const int64_t b = kind == 2 && len >= 6 ? rng.range(a + 1, len - 1) : 0;
    for (int64_t i = 0; i < len; ++i) {
      m.doc.push_back(doc);
      m.idx.push_back(idx0 + int32_t(i) * step);
      m.blk.push_back(kind == 1 || (i >= a && i < b) ? blk : -1);
    }
    ++doc;
    ++blk;
  }
  return m;
}

struct AttnCase {
  std::string name;
  PackMeta qm, km;
  int Hq, Hkv, hd;
};

// Cases for every head dimension in hds; `long_tokens` sizes the longest packs (the device
// test affords thousands of tokens, the emulation a few hundred).
inline std::vector<AttnCase> attention_cases(const std::vector<int>& hds, int64_t long_tokens) {
  Rng rng(4242);
  std::vector<AttnCase> cases;
  for (int hd : hds) {
    const std::string h = " hd=" + std::to_string(hd);
    // One causal document on and around the tile edges.
    for (int64_t T : {1, 63, 64, 65, 130}) {
      PackMeta m = random_pack(rng, T, T, false);
      cases.push_back({"causal T=" + std::to_string(T) + h, m, m, 2, 1, hd});
    }
    // Uneven documents, GQA 4:1.
    {
      PackMeta m = random_pack(rng, long_tokens, long_tokens / 3, false);
      cases.push_back({"documents gqa" + h, m, m, 8, 2, hd});
    }
    // Many short documents: tiles straddle several documents.
    {
      PackMeta m = random_pack(rng, long_tokens / 2, 5, false);
      cases.push_back({"short documents" + h, m, m, 2, 2, hd});
    }
    // Images and text with images inside, longer than a tile.
    {
      PackMeta m = random_pack(rng, long_tokens, 150, true);
      cases.push_back({"images" + h, m, m, 4, 2, hd});
    }
    // A ring step: queries of one chunk against keys of another (Tq != Tk), positions with
    // gaps, documents that the other side lacks (rows that see nothing), a few images.
    {
      PackMeta qm = random_pack(rng, long_tokens / 2 + 7, 60, true, 0, 100);
      PackMeta km = random_pack(rng, long_tokens / 3 + 5, 80, true, 1, 20, 2);
      cases.push_back({"remote keys" + h, qm, km, 4, 1, hd});
    }
    // Every key in the future of every query: nothing visible.
    {
      PackMeta qm = random_pack(rng, 70, 70, false, 0, 0),
               km = random_pack(rng, 90, 90, false, 0, 500);
      cases.push_back({"nothing visible" + h, qm, km, 2, 2, hd});
    }
  }
  return cases;
}

struct AttnData {
  AttnShape s;
  std::vector<float> q, k, v, dout;
  std::vector<float> out, lse, dq, dk, dv;  // the CPU reference's
};

// bf16: the inputs, and the forward output that the backward pass reads, are rounded to bf16
// first, as a kernel with bf16 storage sees them.
inline AttnData reference(const AttnCase& c, uint64_t seed, bool bf16 = false) {
  Rng rng(seed);
  AttnData d;
  d.s = {c.qm.size(), c.km.size(), c.Hq, c.Hkv, c.hd, float(1 / std::sqrt(double(c.hd)))};
  const AttnShape& s = d.s;
  d.q = random_vec(rng, size_t(s.Tq * s.Hq * s.hd), 2.0f);
  d.k = random_vec(rng, size_t(s.Tk * s.Hkv * s.hd), 2.0f);
  d.v = random_vec(rng, size_t(s.Tk * s.Hkv * s.hd));
  d.dout = random_vec(rng, size_t(s.Tq * s.Hq * s.hd));
  auto round = [&](std::vector<float>& x) {
    if (bf16)
      for (float& e : x) e = bf16_round(e);
  };
  for (auto* x : {&d.q, &d.k, &d.v, &d.dout}) round(*x);
  d.out.resize(d.q.size());
  d.lse.resize(size_t(s.Hq * s.Tq));
  d.dq.resize(d.q.size());
  d.dk.resize(d.k.size());
  d.dv.resize(d.v.size());
  cpu::attention_forward(d.out.data(), d.lse.data(), d.q.data(), d.k.data(), d.v.data(),
                         c.qm.view(), c.km.view(), s);
  round(d.out);
  cpu::attention_backward(d.dq.data(), d.dk.data(), d.dv.data(), d.dout.data(), d.out.data(),
                          d.lse.data(), d.q.data(), d.k.data(), d.v.data(), c.qm.view(),
                          c.km.view(), s);
  return d;
}

// |got - want| <= atol·max(1, max |want|) + rtol·|want|, and -inf exactly where want is -inf.
struct AttnTolerance {
  double atol, rtol;
};
// fp32 on both sides, summing in different orders over at most a few thousand terms: about
// 1e-6 relative per sum, far below 1e-4, while a wrong or missing term moves a value by 1e-2
// or more.
constexpr AttnTolerance kFp32Tol{1e-4, 1e-4};
// TF32 operands keep 10 mantissa bits (2^-11 relative rounding): on these cases the emulated
// kernels come out at most 1.1e-3 of the largest value off, so 5e-3 leaves room for the
// hardware's own accumulation order, while misplaced fragments are off by O(1).
constexpr AttnTolerance kTf32Tol{5e-3, 5e-3};
// bf16 storage: on top of TF32 products, every output is rounded to 8 mantissa bits (2^-9
// relative) and the probabilities times dout meet a rounded out in D = rowsum(dout·out).
constexpr AttnTolerance kBf16Tol{1.5e-2, 1.5e-2};

inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want, AttnTolerance tol = kFp32Tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 1.0;
  for (float w : want)
    if (std::isfinite(w)) mx = std::max(mx, double(std::abs(w)));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::isinf(want[i]) ? (got[i] == want[i] ? 0.0 : INFINITY)
                                           : std::abs(double(got[i]) - want[i]);
    const bool ok = err <= tol.atol * mx + tol.rtol * std::abs(want[i]);
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " values differ";
}

}  // namespace dhp::testing
