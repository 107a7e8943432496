// The host's view of an attention call's mask (kernels/attention_runs.h): runs of tokens and
// their pairing into the per-sequence batch entries that cuDNN's fused attention takes. The
// pairing must reproduce the per-token mask rule exactly whenever it says it can, for the
// layouts the model makes (packed documents, images, zigzag ring pieces) and for random ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention_runs.h"

namespace dhp {
namespace {

struct Tokens {
  std::vector<int32_t> doc, idx, blk;
  void add(int32_t d, int32_t i, int32_t b = -1) {
    doc.push_back(d);
    idx.push_back(i);
    blk.push_back(b);
  }
  void add_text(int32_t d, int32_t from, int32_t to) {
    for (int32_t i = from; i < to; ++i) add(d, i);
  }
  int64_t T() const { return int64_t(doc.size()); }
  std::vector<AttnRun> runs() const {
    std::vector<AttnRun> r;
    attention_runs(r, doc.data(), idx.data(), blk.data(), T());
    return r;
  }
};

AttnRuns view(const std::vector<AttnRun>& r) { return AttnRuns{r.data(), int64_t(r.size())}; }

bool sees(const Tokens& q, int64_t i, const Tokens& k, int64_t j) {
  return q.doc[i] == k.doc[j] && (k.idx[j] <= q.idx[i] || (q.blk[i] >= 0 && q.blk[i] == k.blk[j]));
}

// Every (query, key) pair is visible under the per-token rule exactly when the partition's
// segments make it visible; no token is in two segments.
void expect_exact(const Tokens& q, const Tokens& k, const AttnPartition& p) {
  ASSERT_TRUE(p.ok) << p.why;
  std::vector<int> q_seg(size_t(q.T()), -1), k_seg(size_t(k.T()), -1);
  for (size_t s = 0; s < p.segs.size(); ++s) {
    const AttnSegment& g = p.segs[s];
    if (p.causal) {
      EXPECT_EQ(g.q_len, g.k_len);
    }
    if (s > 0) {
      EXPECT_GE(g.k_start, p.segs[s - 1].k_start + p.segs[s - 1].k_len) << "keys out of order";
    }
    for (int64_t i = g.q_start; i < g.q_start + g.q_len; ++i) {
      ASSERT_EQ(q_seg[size_t(i)], -1) << "query " << i << " in two segments";
      q_seg[size_t(i)] = int(s);
    }
    for (int64_t j = g.k_start; j < g.k_start + g.k_len; ++j) {
      ASSERT_EQ(k_seg[size_t(j)], -1) << "key " << j << " in two segments";
      k_seg[size_t(j)] = int(s);
    }
  }
  for (int64_t i = 0; i < q.T(); ++i)
    for (int64_t j = 0; j < k.T(); ++j) {
      bool by_segment = false;
      const int s = q_seg[size_t(i)];
      if (s >= 0 && s == k_seg[size_t(j)]) {
        const AttnSegment& g = p.segs[size_t(s)];
        by_segment = !p.causal || j - g.k_start <= i - g.q_start;
      }
      ASSERT_EQ(by_segment, sees(q, i, k, j)) << "query " << i << ", key " << j;
    }
}

TEST(AttentionRuns, PackedDocumentsAreOneCausalRunEach) {
  Tokens t;
  t.add_text(0, 0, 3);
  t.add_text(1, 0, 5);
  t.add_text(2, 0, 1);
  const auto r = t.runs();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1], (AttnRun{3, 5, 1, -1, 0, 4, true}));
  const AttnPartition p = partition_attention(view(r), view(r));
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.segs.size(), 3u);
  EXPECT_EQ(p.q_covered, t.T());
  EXPECT_EQ(p.max_q, 5);
  expect_exact(t, t, p);
}

TEST(AttentionRuns, ImagesAreOneFullRunEach) {
  // The vision encoder's metadata: doc = blk = image, idx 0 (model/device_batch.cpp).
  Tokens t;
  for (int im = 0; im < 3; ++im)
    for (int k = 0; k < 4 + im; ++k) t.add(im, 0, im);
  const auto r = t.runs();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_FALSE(r[2].consecutive);
  EXPECT_EQ(r[2].len, 6);
  const AttnPartition p = partition_attention(view(r), view(r));
  EXPECT_FALSE(p.causal);
  expect_exact(t, t, p);
}

TEST(AttentionRuns, ZigzagRingBlocks) {
  // One 8-token document over a ring of 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  Tokens r0, r1;
  r0.add_text(0, 0, 2);
  r0.add_text(0, 6, 8);
  r1.add_text(0, 2, 6);
  const auto k0 = r0.runs(), k1 = r1.runs();
  ASSERT_EQ(k0.size(), 2u);
  ASSERT_EQ(k1.size(), 1u);
  // Rank 0's own block mixes two causal diagonals with a full block: the per-token kernel.
  const AttnPartition own = partition_attention(view(k0), view(k0));
  EXPECT_FALSE(own.ok);
  EXPECT_FALSE(own.why.empty());
  // Rank 0's queries on rank 1's keys: only the last chunk sees them, all of them.
  const AttnPartition a = partition_attention(view(k0), view(k1));
  EXPECT_FALSE(a.causal);
  EXPECT_EQ(a.q_covered, 2);
  expect_exact(r0, r1, a);
  // Rank 1's queries on rank 0's keys: the first chunk, fully; the last one, not at all.
  const AttnPartition b = partition_attention(view(k1), view(k0));
  EXPECT_EQ(b.k_covered, 2);
  expect_exact(r1, r0, b);
  // Rank 1's own block: one causal diagonal.
  expect_exact(r1, r1, partition_attention(view(k1), view(k1)));
}

TEST(AttentionRuns, BackToBackFullKeyRunsMergeAndSharedKeysDoNot) {
  // Keys of one document in two runs stored back to back, both before the queries.
  Tokens q, k;
  q.add_text(0, 10, 12);
  k.add_text(0, 0, 2);
  k.add_text(0, 5, 7);
  const AttnPartition p = partition_attention(view(q.runs()), view(k.runs()));
  ASSERT_EQ(p.segs.size(), 1u);
  EXPECT_EQ(p.segs[0], (AttnSegment{0, 2, 0, 4}));
  expect_exact(q, k, p);
  // The same two key runs with another document's keys between them: not one block.
  Tokens split;
  split.add_text(0, 0, 2);
  split.add_text(1, 0, 2);
  split.add_text(0, 5, 7);
  const AttnPartition sp = partition_attention(view(q.runs()), view(split.runs()));
  EXPECT_FALSE(sp.ok);
  EXPECT_NE(sp.why.find("not one full block"), std::string::npos) << sp.why;
  // Two query runs seeing one key run: dK would be written twice.
  Tokens q2;
  q2.add_text(0, 10, 12);
  q2.add_text(0, 20, 22);
  const AttnPartition s = partition_attention(view(q2.runs()), view(k.runs()));
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.why.find("seen by query runs"), std::string::npos) << s.why;
  // One document's diagonal beside another's full block.
  Tokens qm, km;
  qm.add_text(0, 0, 2);
  qm.add_text(1, 5, 7);
  km.add_text(0, 0, 2);
  km.add_text(1, 0, 2);
  const AttnPartition m = partition_attention(view(qm.runs()), view(km.runs()));
  EXPECT_FALSE(m.ok);
  EXPECT_NE(m.why.find("mixes"), std::string::npos) << m.why;
  // Keys overlapping the queries' positions without being their diagonal.
  Tokens q3, k3;
  q3.add_text(0, 4, 8);
  k3.add_text(0, 2, 6);
  const AttnPartition o = partition_attention(view(q3.runs()), view(k3.runs()));
  EXPECT_FALSE(o.ok);
  EXPECT_NE(o.why.find("only part"), std::string::npos) << o.why;
}

// Random layouts: documents cut into pieces, some with image blocks, queries and keys drawn
// from different cuts. Whenever the partition says it can run a call, its segments are the
// mask, exactly; and calls it refuses are refused for a reason it names.
TEST(AttentionRuns, RandomLayoutsEitherMatchTheMaskExactlyOrAreRefused) {
  std::mt19937 rng(7);
  int exact = 0, refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    // Pieces of documents in shuffled order: a text document may be cut in two (as a ring
    // cuts it), so a document's runs need not lie back to back.
    auto make = [&](int docs) {
      std::vector<Tokens> pieces;
      for (int d = 0; d < docs; ++d) {
        const int len = 1 + int(rng() % 12);
        const int32_t from = int32_t(rng() % 3 == 0 ? rng() % 10 : 0);
        Tokens p;
        if (rng() % 4 == 0) {
          for (int i = 0; i < len; ++i) p.add(d, 0, int32_t(rng() % 2));  // images
          pieces.push_back(p);
        } else if (len >= 4 && rng() % 3 == 0) {
          const int32_t cut = from + 1 + int32_t(rng() % uint32_t(len - 2));
          p.add_text(d, from, cut);
          pieces.push_back(p);
          Tokens rest;
          rest.add_text(d, cut + int32_t(rng() % 3), from + len);
          pieces.push_back(rest);
        } else {
          p.add_text(d, from, from + len);
          pieces.push_back(p);
        }
      }
      std::shuffle(pieces.begin(), pieces.end(), rng);
      Tokens t;
      for (const Tokens& p : pieces)
        for (int64_t i = 0; i < p.T(); ++i) t.add(p.doc[size_t(i)], p.idx[size_t(i)], p.blk[size_t(i)]);
      return t;
    };
    const int docs = 1 + int(rng() % 4);
    const Tokens q = make(docs), k = rng() % 2 ? q : make(docs);
    const auto qr = q.runs(), kr = k.runs();
    const AttnPartition p = partition_attention(view(qr), view(kr));
    if (p.ok) {
      expect_exact(q, k, p);
      ++exact;
    } else {
      EXPECT_FALSE(p.why.empty());
      ++refused;
    }
    if (testing::Test::HasFatalFailure()) return;
  }
  // Both outcomes are exercised.
  EXPECT_GT(exact, 50);
  EXPECT_GT(refused, 20);
}

}  // namespace
}  // namespace dhp
