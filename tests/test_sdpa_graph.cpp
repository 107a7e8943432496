// The host side of cuDNN's fused attention: the operation graphs handed to cuDNN
// (kernels/cuda/sdpa_graph.h) are well formed for every class the trainer can meet, with the
// packed layout, masks and outputs they promise; shape classes bucket as documented; the plan
// cache stays within its bound. No CUDA library is linked: this runs on any build machine
// (test_cuda_cudnn lowers the same graphs into cuDNN's own descriptors).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/cuda/lru_cache.h"
#include "kernels/cuda/sdpa_graph.h"

namespace dhp::cuda {
namespace {

using sdpa::Graph;
using sdpa::Op;
using sdpa::OpKind;
using sdpa::Pass;
using sdpa::ShapeClass;
using sdpa::Tensor;

std::vector<ShapeClass> classes() {
  std::vector<ShapeClass> out;
  for (Pass pass : {Pass::forward, Pass::backward})
    for (int hd : {16, 32, 64, 80, 96, 128})
      for (auto [Hq, Hkv] : {std::pair{8, 8}, std::pair{8, 2}})
        for (bool causal : {true, false})
          out.push_back(ShapeClass{pass, CUDNN_DATA_BFLOAT16, hd, Hq, Hkv, causal, 4, 256, causal ? 256 : 512});
  out.push_back(ShapeClass{Pass::backward, CUDNN_DATA_HALF, 64, 4, 1, true, 1, 64, 64});
  return out;
}

Graph graph_of(const ShapeClass& c) {
  return c.pass == Pass::forward ? sdpa::forward_graph(c) : sdpa::backward_graph(c);
}

std::vector<int64_t> inputs_of(const Op& op) {
  std::vector<int64_t> in;
  for (int64_t u : {op.x, op.b, op.t, op.m_override, op.n_override, op.k_override})
    if (u) in.push_back(u);
  return in;
}

int count_ops(const Graph& g, OpKind kind, cudnnPointwiseMode_t mode) {
  return int(std::count_if(g.ops.begin(), g.ops.end(),
                           [&](const Op& o) { return o.kind == kind && (kind != OpKind::pointwise || o.mode == mode); }));
}

TEST(SdpaGraph, EveryClassIsAWellFormedGraph) {
  for (const ShapeClass& c : classes()) {
    SCOPED_TRACE(c.name());
    const Graph g = graph_of(c);
    std::map<int64_t, const Tensor*> by_uid;
    for (const Tensor& t : g.tensors) {
      ASSERT_TRUE(by_uid.emplace(t.uid, &t).second) << "uid " << t.uid << " twice";
      EXPECT_EQ(t.is_virtual, t.uid >= sdpa::kFirstVirtual) << t.uid;
      if (t.ragged) {
        ASSERT_TRUE(by_uid.count(t.ragged) || std::any_of(g.tensors.begin(), g.tensors.end(),
                                                          [&](const Tensor& o) { return o.uid == t.ragged; }));
      }
    }
    // Inputs: bound tensors or outputs of earlier ops; every virtual tensor written once,
    // before it is read; no op writes a tensor the caller provides as input.
    const std::set<int64_t> inputs = c.pass == Pass::forward
                                         ? std::set<int64_t>{sdpa::kQ, sdpa::kK, sdpa::kV}
                                         : std::set<int64_t>{sdpa::kQ, sdpa::kK, sdpa::kV, sdpa::kO,
                                                             sdpa::kDO, sdpa::kStats};
    std::set<int64_t> written;
    for (const Op& op : g.ops) {
      for (int64_t u : inputs_of(op)) {
        ASSERT_TRUE(by_uid.count(u)) << "unknown tensor " << u;
        if (by_uid[u]->is_virtual) {
          EXPECT_TRUE(written.count(u)) << "virtual " << u << " read before written";
        }
      }
      ASSERT_TRUE(by_uid.count(op.y));
      EXPECT_TRUE(written.insert(op.y).second) << "tensor " << op.y << " written twice";
      EXPECT_FALSE(inputs.count(op.y)) << "an op writes input " << op.y;
    }
    for (const Tensor& t : g.tensors) {
      if (t.is_virtual) {
        EXPECT_TRUE(written.count(t.uid)) << "virtual " << t.uid << " never written";
      }
    }
    const std::set<int64_t> outputs = c.pass == Pass::forward
                                          ? std::set<int64_t>{sdpa::kO, sdpa::kStats}
                                          : std::set<int64_t>{sdpa::kDQ, sdpa::kDK, sdpa::kDV, sdpa::kSoftmaxSum,
                                                              sdpa::kDQAccum};
    for (int64_t u : outputs) EXPECT_TRUE(written.count(u)) << "output " << u << " never written";
  }
}

TEST(SdpaGraph, PackedTokensWithRaggedOffsetsAndLengths) {
  const ShapeClass c{Pass::backward, CUDNN_DATA_BFLOAT16, 64, 8, 2, true, 4, 128, 128};
  const Graph g = sdpa::backward_graph(c);
  // q (T, 8, 64) as [4, 8, 128, 64]: a token's heads are adjacent, tokens 8·64 apart.
  const Tensor& q = g.tensor(sdpa::kQ);
  EXPECT_EQ(q.dims, (std::array<int64_t, 4>{4, 8, 128, 64}));
  EXPECT_EQ(q.strides, (std::array<int64_t, 4>{128 * 8 * 64, 64, 8 * 64, 1}));
  EXPECT_EQ(q.ragged, sdpa::kOffQ);
  EXPECT_EQ(q.type, CUDNN_DATA_BFLOAT16);
  // k (T, 2, 64) enters transposed: [4, 2, 64, 128].
  const Tensor& k = g.tensor(sdpa::kK);
  EXPECT_EQ(k.dims, (std::array<int64_t, 4>{4, 2, 64, 128}));
  EXPECT_EQ(k.strides, (std::array<int64_t, 4>{128 * 2 * 64, 64, 1, 2 * 64}));
  EXPECT_EQ(k.ragged, sdpa::kOffK);
  // dK and dV untransposed, on the keys' offsets.
  EXPECT_EQ(g.tensor(sdpa::kDK).dims, (std::array<int64_t, 4>{4, 2, 128, 64}));
  EXPECT_EQ(g.tensor(sdpa::kDV).ragged, sdpa::kOffK);
  // Statistics and row sums (T, Hq) fp32; dQ accumulated in fp32 on the queries' offsets.
  for (int64_t u : {int64_t(sdpa::kStats), int64_t(sdpa::kSoftmaxSum)}) {
    const Tensor& s = g.tensor(u);
    EXPECT_EQ(s.strides, (std::array<int64_t, 4>{128 * 8, 1, 8, 1}));
    EXPECT_EQ(s.ragged, sdpa::kOffStats);
    EXPECT_EQ(s.type, CUDNN_DATA_FLOAT);
  }
  EXPECT_EQ(g.tensor(sdpa::kDQAccum).type, CUDNN_DATA_FLOAT);
  EXPECT_EQ(g.tensor(sdpa::kDQAccum).ragged, sdpa::kOffQ);
  // Lengths per entry (B, int32) and offsets (B + 1, int64).
  EXPECT_EQ(g.tensor(sdpa::kSeqQ).dims[0], 4);
  EXPECT_EQ(g.tensor(sdpa::kSeqQ).type, CUDNN_DATA_INT32);
  EXPECT_EQ(g.tensor(sdpa::kOffK).dims[0], 5);
  EXPECT_EQ(g.tensor(sdpa::kOffK).type, CUDNN_DATA_INT64);
  // Every product is cut to the entries' lengths.
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::matmul) {
      EXPECT_TRUE(op.m_override && (op.n_override || op.k_override));
    }
  }
  // The caller binds exactly these (the by-value constants get host pointers).
  std::set<int64_t> bound;
  for (int64_t u : g.bound())
    if (u < sdpa::kNegInf) bound.insert(u);
  EXPECT_EQ(bound, (std::set<int64_t>{sdpa::kQ, sdpa::kK, sdpa::kV, sdpa::kO, sdpa::kStats, sdpa::kDO, sdpa::kDQ,
                                      sdpa::kDK, sdpa::kDV, sdpa::kScale, sdpa::kSeqQ, sdpa::kSeqKV, sdpa::kOffQ,
                                      sdpa::kOffK, sdpa::kOffStats, sdpa::kSoftmaxSum, sdpa::kDQAccum, sdpa::kOne}));
}

TEST(SdpaGraph, MasksAndHeadGroups) {
  for (const ShapeClass& c : classes()) {
    SCOPED_TRACE(c.name());
    const Graph g = graph_of(c);
    // The padding mask always (packed entries have lengths); the diagonal only when causal.
    EXPECT_EQ(count_ops(g, OpKind::pointwise, CUDNN_POINTWISE_CMP_LT), 2);
    EXPECT_EQ(count_ops(g, OpKind::pointwise, CUDNN_POINTWISE_CMP_GE), c.causal ? 1 : 0);
    EXPECT_EQ(count_ops(g, OpKind::pointwise, CUDNN_POINTWISE_BINARY_SELECT), c.causal ? 2 : 1);
    for (const Op& op : g.ops)
      if (op.kind == OpKind::pointwise && op.mode == CUDNN_POINTWISE_GEN_INDEX) {
        EXPECT_TRUE(op.axis == 2 || op.axis == 3);
        EXPECT_EQ(g.tensor(op.y).type, CUDNN_DATA_INT32);
      }
    // Backward under GQA sums dK and dV over each group's query heads.
    int head_sums = 0;
    for (const Op& op : g.ops)
      if (op.kind == OpKind::reduction && g.tensor(op.x).dims[1] == c.Hq && g.tensor(op.y).dims[1] == c.Hkv &&
          c.Hq != c.Hkv)
        ++head_sums;
    EXPECT_EQ(head_sums, c.pass == Pass::backward && c.Hq != c.Hkv ? 2 : 0);
  }
  // Forward: the statistics are max + log(sum), and P reaches the second product in the
  // storage type.
  const Graph f = sdpa::forward_graph({Pass::forward, CUDNN_DATA_HALF, 32, 2, 2, false, 1, 64, 64});
  EXPECT_EQ(count_ops(f, OpKind::pointwise, CUDNN_POINTWISE_LOG), 1);
  const Op& last = f.ops.back();
  EXPECT_EQ(last.kind, OpKind::matmul);
  EXPECT_EQ(last.y, sdpa::kO);
  EXPECT_EQ(f.tensor(last.x).type, CUDNN_DATA_HALF);
}

TEST(SdpaGraph, ShapeClassesBucketAndRefuseWhatCudnnCannotTake) {
  EXPECT_EQ(sdpa::bucket(1, 64), 64);
  EXPECT_EQ(sdpa::bucket(64, 64), 64);
  EXPECT_EQ(sdpa::bucket(65, 64), 128);
  EXPECT_EQ(sdpa::bucket(3, 1), 4);
  AttnPartition p;
  p.ok = true;
  p.causal = true;
  p.segs = {{0, 300, 0, 300}, {300, 90, 300, 90}, {390, 500, 390, 500}};
  p.max_q = p.max_k = 500;
  const AttnShape s{890, 890, 16, 4, 128, 0.1f};
  const ShapeClass c = sdpa::shape_class(Pass::forward, CUDNN_DATA_BFLOAT16, s, p);
  EXPECT_EQ(c.batch, 4);
  EXPECT_EQ(c.sq, 512);
  EXPECT_EQ(c.skv, 512);
  EXPECT_TRUE(c.causal);
  // A pack of other lengths in the same buckets is the same class: one plan serves both.
  AttnPartition p2 = p;
  p2.segs.push_back({890, 10, 890, 10});
  p2.max_q = p2.max_k = 400;
  EXPECT_EQ(sdpa::shape_class(Pass::forward, CUDNN_DATA_BFLOAT16, s, p2), c);
  EXPECT_NE(sdpa::ShapeClassHash()(c), sdpa::ShapeClassHash()(sdpa::shape_class(Pass::backward, CUDNN_DATA_BFLOAT16, s, p)));
  // Head dimensions cuDNN has no engine for are refused when the graph is made.
  ShapeClass bad = c;
  bad.hd = 20;
  EXPECT_THROW(sdpa::forward_graph(bad), std::exception);
  bad = c;
  bad.Hkv = 3;
  EXPECT_THROW(sdpa::backward_graph(bad), std::exception);
}

TEST(LruCache, KeepsTheMostRecentlyUsedWithinItsBound) {
  LruCache<int, std::string> cache(2);
  int made = 0;
  auto make = [&](int k) { return [&, k] { ++made; return std::to_string(k); }; };
  EXPECT_EQ(cache.get(1, make(1)), "1");
  EXPECT_EQ(cache.get(2, make(2)), "2");
  EXPECT_EQ(cache.get(1, make(1)), "1");  // a hit: 1 is now the most recent
  EXPECT_EQ(cache.get(3, make(3)), "3");  // evicts 2
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.find(2), nullptr);
  ASSERT_NE(cache.find(1), nullptr);
  EXPECT_EQ(made, 3);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 3u);
  EXPECT_EQ(cache.evictions(), 1u);
  // A failed make leaves everything as it was.
  EXPECT_THROW(cache.get(4, []() -> std::string { throw std::runtime_error("no plan"); }), std::runtime_error);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.find(1), nullptr);
  EXPECT_NE(cache.find(3), nullptr);
}

}  // namespace
}  // namespace dhp::cuda
